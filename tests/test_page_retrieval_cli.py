"""``gsdistill eval retrieval`` / ``eval split`` through the real CLI, with a fake model and encoder."""
from __future__ import annotations

import json

import pytest
import yaml

from gsdistill.cli import main as gsdistill
from test_page_retrieval import FakeTextEncoder, _model_for, _pages


@pytest.fixture
def page_shards(tmp_path):
    from gsdistill.tuples.store.writer import write_shards
    pages = _pages(40)
    for p in pages:
        p["source"] = "test"
    write_shards(pages, tmp_path / "all", pages_per_shard=16)
    return pages, tmp_path


def _fake_run(run_dir, shards):
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"data": {"shards": str(shards)}, "views": {"global_size": 8}}))
    return run_dir


def test_split_then_eval_two_models(page_shards, monkeypatch, capsys):
    pages, tmp = page_shards
    import gsdistill.models.text_encoder as te
    import gsdistill.pretrain.checkpoint as ckpt
    models = {"sp": _model_for(pages, 2.0), "mpcl": _model_for(pages, 0.5)}
    monkeypatch.setattr(ckpt, "load_pretrained", lambda path, device="cpu": models[path.name])
    monkeypatch.setattr(te, "TextEncoder", lambda name=None, device="cpu": FakeTextEncoder())
    assert gsdistill(["eval", "split", str(tmp / "all"), "--train-out", str(tmp / "train"),
                      "--eval-out", str(tmp / "eval"), "--fraction", "0.5", "--pages-per-shard", "8"]) == 0
    split = json.loads((tmp / "eval" / "split.json").read_text())
    assert len(split["eval_docs"]) == 5 and not set(split["eval_docs"]) & set(split["train_docs"])
    for name in models:
        _fake_run(tmp / name, tmp / "train")
    out = tmp / "out"
    rc = gsdistill(["eval", "retrieval", "--model", str(tmp / "sp"), "--label", "SP", "--model", str(tmp / "mpcl"),
                    "--label", "MPCL", "--pages", str(tmp / "eval"), "--out", str(out),
                    "retrieval.ks=[1,3]", "retrieval.seeds=[0,1]", "retrieval.device=cpu"])
    assert rc == 0
    table = (out / "table.md").read_text()
    assert "| MPCL | per crop (multi-positive) |" in table and "| SP | concatenated (single-positive) |" in table
    res = json.loads((out / "results.json").read_text())
    assert res["SP"]["n_gallery"] == 20 and res["SP"]["image_size"] == 8  # the run's global view size
    assert (out / "acc_vs_k.png").is_file() and (out / "text_cache" / "FakeTextEncoder.safetensors").is_file()
    # pages from the pretraining documents are refused, with the documents named
    capsys.readouterr()
    report = (out / "results.json").read_bytes()
    rc = gsdistill(["eval", "retrieval", "--model", str(tmp / "sp"), "--pages", str(tmp / "all"), "--out", str(out),
                    "--overwrite"])  # (--out holds the evaluation above: refused without --overwrite)
    assert rc == 2 and "also in the pretraining data" in capsys.readouterr().err
    assert (out / "results.json").read_bytes() == report  # refused: the earlier report is kept
    # a misspelled key is a config error with a hint
    rc = gsdistill(["eval", "retrieval", "--model", str(tmp / "sp"), "--pages", str(tmp / "eval"),
                    "retrieval.n_galery=5"])
    assert rc == 2 and "did you mean 'retrieval.n_gallery'" in capsys.readouterr().err
