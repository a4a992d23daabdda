"""``gsdistill tuples`` against bad input, round 2 (issue 33): a rebuilt shard never trains on the old
page's text, a damaged shard member is one line naming it, data errors exit 2, settings are checked
before any data is read. (Killed builds and a full disk: test_reliability_tuples_procs.py.)"""
from __future__ import annotations

import json
import logging
import tarfile
import zlib

import numpy as np
import pymupdf
import pytest

from gsdistill.cli import main as gsdistill
from gsdistill.config import load_config
from gsdistill.tuples.descriptors import span_texts
from gsdistill.tuples.embedding.stage import embed_shards
from gsdistill.tuples.errors import DataError
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.store.text_cache import fields_for, open_embeddings


class WordEncoder:
    """A text -> a unit vector from its CRC (deterministic in any process), of MiniLM's size."""
    dim = 384

    def __init__(self, name=None, device="cpu", precision="fp32"):
        pass

    def encode(self, texts, batch_size=64):
        rows = np.array([np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim) for t in texts])
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def small_pdf(path, words: str) -> None:
    """One small page of text: its shard (one page at 36 dpi) is far below tar's 10 KiB padding."""
    doc = pymupdf.open()
    doc.new_page(width=200, height=150).insert_text((20, 40), words, fontsize=9)
    doc.save(path)


def build(src, out, *extra) -> int:
    return gsdistill(["tuples", "build", "--from", "pdf", str(src), "--out", str(out), "--dpi", "36",
                      "--pages-per-shard", "1", "--workers", "1", "build.progress=false", *extra])


def flip_member_bytes(shard, suffix: str) -> str:
    """Overwrite 4 bytes in the middle of the first ``suffix`` member, keeping the shard's size."""
    with tarfile.open(shard) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(suffix))
    with open(shard, "r+b") as fh:
        fh.seek(member.offset_data + member.size // 2)
        fh.write(b"\xff\xfe\x00\x01")
    return member.name


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# ---- row 1: the text cache is keyed by content, not by the shard's byte size ------------------------
def test_edited_pdf_whose_shard_keeps_its_size_gets_new_embeddings(tmp_path, caplog):
    src, out = tmp_path / "in", tmp_path / "shards"
    src.mkdir()
    small_pdf(src / "a.pdf", "alpha bravo charlie delta echo")
    small_pdf(src / "b.pdf", "unchanged words on the second document")
    assert build(src, out) == 0
    assert not embed_shards(out, WordEncoder, "words", progress=False).reused
    sizes = {p.name: p.stat().st_size for p in out.glob("shard-*.tar")}
    small_pdf(src / "a.pdf", "zulu yankee xray whisky victor")  # same page count, other words
    assert build(src, out) == 0
    assert {p.name: p.stat().st_size for p in out.glob("shard-*.tar")} == sizes, "tar padding hides the edit"
    with pytest.raises(DataError, match="shard-000000.tar: its pages changed"):  # a stale cache is refused
        list(read_pages(out, decode_images=False, embeddings=open_embeddings(out)))
    with caplog.at_level(logging.WARNING, logger="gsdistill.tuples"):
        report = embed_shards(out, WordEncoder, "words", progress=False)
    assert not report.reused and report.pages == 1, "only the changed shard is embedded again"
    (line,) = [r.getMessage() for r in caplog.records if "embeddings" in r.getMessage()]  # the build says its own line
    assert "threw away the cached text embeddings of 1 of 2 shards whose pages changed (shard-000000.tar)" in line
    for page in read_pages(out, decode_images=False, embeddings=open_embeddings(out)):
        np.testing.assert_array_equal(page["sem_emb"], WordEncoder().encode(span_texts(page)))
    assert "zulu" in " ".join(span_texts(next(read_pages(out, decode_images=False))))
    assert embed_shards(out, WordEncoder, "words", progress=False).reused


def test_a_changed_setting_says_it_throws_everything_away(tmp_path):
    src, out = tmp_path / "in", tmp_path / "shards"
    src.mkdir()
    small_pdf(src / "a.pdf", "alpha bravo")
    assert build(src, out) == 0
    embed_shards(out, WordEncoder, "words", progress=False)
    report = embed_shards(out, WordEncoder, "other-words", progress=False)
    assert report.discarded == "threw away the cached text embeddings of all 1 shards: encoder 'words' -> 'other-words'"


# ---- row 2: a damaged shard member is one line naming the shard and the member ------------------------
def test_damaged_json_member_in_tuples_embed_force(tmp_path, capsys, monkeypatch):
    import gsdistill.models.text_encoder as text_encoder
    monkeypatch.setattr(text_encoder, "TextEncoder", WordEncoder)
    out = tmp_path / "syn"
    assert gsdistill(["tuples", "build", "--from", "synthetic", "2", "--out", str(out), "build.progress=false",
                      "synthetic.width=256", "synthetic.height=256"]) == 0
    member = flip_member_bytes(out / "shard-000000.tar", ".json")
    assert gsdistill(["tuples", "embed", str(out), "--force", "embed.device=cpu"]) == 2
    line = error_line(capsys)
    assert f"{out / 'shard-000000.tar'}: member {member} is damaged (UnicodeDecodeError" in line


@pytest.mark.parametrize("fmt", ["zst", "png"])
def test_damaged_image_member_in_pretrain_with_a_dataloader_worker(tmp_path, capsys, fmt):
    out = tmp_path / "syn"
    assert gsdistill(["tuples", "build", "--from", "synthetic", "4", "--out", str(out), "build.progress=false",
                      "synthetic.width=256", "synthetic.height=256", f"build.image_format={fmt}"]) == 0
    member = flip_member_bytes(out / "shard-000000.tar", f".{fmt}")
    cfg = load_config("pretrain")  # the cache pretraining asks for, made here without loading MiniLM
    embed_shards(out, WordEncoder, str(cfg.model.text_encoder), descriptor_format=str(cfg.data.descriptor_format),
                 fields=fields_for(str(cfg.objective.positives)), progress=False)
    tiny = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
            "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
            "optim.batch_size=4", "optim.steps=2", "optim.warmup_steps=1", "train.progress=false",
            "train.tensorboard=false", "train.plots=false"]
    assert gsdistill(["pretrain", f"data.shards={out}", "data.num_workers=1", f"train.run_dir={tmp_path / 'run'}",
                      *tiny]) == 2
    line = error_line(capsys)
    assert line.startswith(f"gsdistill pretrain: {out / 'shard-000000.tar'}: member {member}: damaged page image")


def test_damaged_manifest_and_cache_meta_are_one_line(tmp_path, capsys):
    out = tmp_path / "syn"
    assert gsdistill(["tuples", "build", "--from", "synthetic", "1", "--out", str(out), "build.progress=false",
                      "synthetic.width=256", "synthetic.height=256"]) == 0
    embed_shards(out, WordEncoder, "words", progress=False)
    (out / "embeddings" / "meta.json").write_bytes(b"\xff{")
    assert gsdistill(["tuples", "info", str(out)]) == 2
    assert "embeddings/meta.json: unreadable embeddings meta" in error_line(capsys)
    assert embed_shards(out, WordEncoder, "words", progress=False).discarded.startswith(
        "threw away the text embeddings cache:")
    (out / "manifest.json").write_text('{"format": "gsdistill-sh')
    assert gsdistill(["tuples", "info", str(out)]) == 2
    assert "manifest.json: unreadable manifest file" in error_line(capsys)


# ---- row 6: data errors exit 2; bad settings are refused before any data is read ----------------------
@pytest.mark.parametrize("args, says", [
    (["build", "--from", "pdf", "{tmp}/missing", "--out", "{tmp}/o"], "missing: no such file or folder"),
    (["build", "--from", "pdf", "{tmp}/empty", "--out", "{tmp}/o"], "empty: empty folder, no input files"),
    (["build", "--from", "pdf", "{tmp}/in", "--out", "{tmp}/o", "--limit", "0"], "'build.limit': 0 is out of range"),
    (["build", "--from", "pdf", "{tmp}/in", "--out", "{tmp}/o", "--dpi", "3000"],
     "pdf.dpi (--dpi) must be 18..801, got 3000"),
    (["build", "--from", "pdf", "{tmp}/in", "--out", "{tmp}/o", "--workers", "0"],
     "'build.workers': 0 is out of range (must be >= 1)"),
    (["build", "--from", "synthetic", "0", "--out", "{tmp}/o"], "number of pages (>= 1)"),
    (["info", "{tmp}/empty"], "empty: no manifest.json"),
    (["embed", "{tmp}/empty"], "empty: no manifest.json"),
    (["embed", "{tmp}/empty", "--workers", "0"], "'embed.workers': 0 is out of range"),
])
def test_data_and_setting_errors_exit_2_before_anything_is_written(tmp_path, capsys, args, says):
    (tmp_path / "empty").mkdir()
    (tmp_path / "in").mkdir()
    small_pdf(tmp_path / "in" / "a.pdf", "some words")
    assert gsdistill(["tuples", *[a.format(tmp=tmp_path) for a in args]]) == 2
    assert says in error_line(capsys)
    assert not (tmp_path / "o").exists()


def test_inputs_that_give_no_page_exit_2_with_the_skips(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "broken.pdf").write_bytes(b"not a pdf")
    assert build(tmp_path / "in", tmp_path / "o") == 2
    line = error_line(capsys)
    assert "in: no page could be built; 1 inputs skipped {'unreadable PDF': 1}" in line and "skipped.csv" in line


# ---- row 7: --out naming an existing file ----------------------------------------------------------------
def test_out_naming_an_existing_file_is_one_line(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    small_pdf(tmp_path / "in" / "a.pdf", "some words")
    (tmp_path / "taken").write_text("mine")
    assert build(tmp_path / "in", tmp_path / "taken") == 2
    assert f"{tmp_path / 'taken'}: --out is an existing file, not a folder" in error_line(capsys)
    assert (tmp_path / "taken").read_text() == "mine"
    assert build(tmp_path / "in", tmp_path / "taken" / "sub") == 2
    assert f"{tmp_path / 'taken'} is a file, not a folder" in error_line(capsys)  # checked before any write
    assert (tmp_path / "taken").read_text() == "mine"


def test_out_inside_the_input_folder_is_not_read_as_input(tmp_path):
    (tmp_path / "in").mkdir()
    small_pdf(tmp_path / "in" / "a.pdf", "some words")
    out = tmp_path / "in" / "shards"
    assert build(tmp_path / "in", out) == 0
    built = (out / "shard-000000.tar").stat().st_mtime_ns
    assert build(tmp_path / "in", out) == 0  # its shards, records and csv are no inputs: the run resumes
    assert (out / "shard-000000.tar").stat().st_mtime_ns == built
    assert json.loads((out / "manifest.json").read_text())["skipped_count"] == 0
