"""``gsdistill tuples build / embed / info`` end to end (small inputs)."""
from __future__ import annotations

import json

import numpy as np
import yaml

from gsdistill.cli import main as gsdistill
from gsdistill.embed.cli import main  # the `gsdistill tuples` command (embed included)
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.store.text_cache import open_embeddings


def test_build_synthetic_shards_info_and_saved_config(tmp_path, capsys):
    out = tmp_path / "syn"
    assert main(["build", "--from", "synthetic", "5", "--out", str(out), "--pages-per-shard", "2",
                 "synthetic.width=300", "synthetic.height=400", "build.progress=false"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["pages"] for s in manifest["shards"]] == [2, 2, 1]
    pages = list(read_pages(out))
    assert len(pages) == 5 and pages[0]["image"].size == (300, 400)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["build"]["pages_per_shard"] == 2 and saved["synthetic"]["width"] == 300
    printed = capsys.readouterr().out
    assert "5 pages" in printed and "Text" in printed
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert f"{out}: 5 pages" in info and "embeddings: none" in info
    text_row = next(line for line in info.splitlines() if line.startswith("Text "))
    assert text_row.split()[2] == "5" and text_row.split()[3] == "100.0%"


def test_flags_and_overrides_set_config_keys(tmp_path):
    from gsdistill.tuples.cli import _config, _parser
    args = _parser().parse_args(["build", "--from", "pdf", "in", "--out", "o", "--dpi", "150", "--max-pages", "7",
                                 "--limit", "3", "--no-ocr"])
    args.overrides = ["pdf.max_page_count=9", "pdf.dpi=99"]
    cfg = _config(args)  # flags win over key=value
    assert (cfg.pdf.dpi, cfg.build.max_pages, cfg.build.limit, cfg.ocr.enabled, cfg.pdf.max_page_count) == (150, 7, 3, False, 9)


def test_max_pages_limits_output(tmp_path):
    out = tmp_path / "few"
    assert main(["build", "--from", "synthetic", "50", "--out", str(out), "--max-pages", "3",
                 "synthetic.width=256", "synthetic.height=256", "build.progress=false"]) == 0
    assert json.loads((out / "manifest.json").read_text())["pages"] == 3


def test_unknown_key_and_bad_input_are_clear_errors(tmp_path, capsys):
    assert gsdistill(["tuples", "build", "--from", "synthetic", "2", "--out", str(tmp_path / "x"), "pdf.dpy=3"]) == 2
    assert "pdf.dpi" in capsys.readouterr().err  # did-you-mean
    assert main(["build", "--from", "synthetic", "many", "--out", str(tmp_path / "y")]) == 2
    assert "number of pages" in capsys.readouterr().err
    assert main(["info", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    empty = tmp_path / "pdfs"
    empty.mkdir()
    (empty / "broken.pdf").write_bytes(b"not a pdf")
    assert main(["build", "--from", "pdf", str(empty), "--out", str(tmp_path / "z"), "build.progress=false"]) == 2
    assert "unreadable PDF" in (tmp_path / "z" / "skipped.csv").read_text()


def test_embed_caches_minilm_vectors(tmp_path):
    out = tmp_path / "one"
    assert main(["build", "--from", "synthetic", "1", "--out", str(out), "synthetic.width=256",
                 "synthetic.height=256", "build.progress=false"]) == 0
    assert main(["embed", str(out), "embed.max_spans=3", "embed.device=cpu"]) == 0
    (page,) = read_pages(out, embeddings=open_embeddings(out))
    assert page["sem_emb"].shape == (min(3, len(page["spans"])), 384)
    assert np.allclose(np.linalg.norm(page["sem_emb"], axis=1), 1.0, atol=1e-3)  # MiniLM output is L2-normalised
    assert "sp_sem_emb" not in page  # the whole-page texts only for the single-positive rows (embed.positives)
    meta = json.loads((out / "embeddings" / "meta.json").read_text())
    assert meta["encoder"] == "all-MiniLM-L6-v2" and meta["max_spans"] == 3 and meta["fields"] == ["sem", "geom"]
    assert main(["embed", str(out), "embed.max_spans=3", "embed.device=cpu", "embed.positives=single"]) == 0
    (page,) = read_pages(out, embeddings=open_embeddings(out))
    assert np.allclose(np.linalg.norm(page["sp_sem_emb"]), 1.0, atol=1e-3)
