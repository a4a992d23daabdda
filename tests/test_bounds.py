"""Issue 63 item 5: ``views.max_spans`` says what it does. Spans and boxes cut at the bound are counted
per run (the run's data line and ``history.jsonl``, from the manifest's per-page histograms or, for an
older manifest, from the page records), and the bound has an upper limit that fits memory, checked at
start in one line."""
from __future__ import annotations

import json

import pytest

from gsdistill.cli import main
from gsdistill.config import load_config
from gsdistill.pretrain.bounds import cut_at_max_spans, max_spans_limit
from gsdistill.pretrain.run import run_pretraining
from gsdistill.run_history import read as read_history
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.tuples.store.writer import write_shards

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "optim.batch_size=4", "optim.steps=2", "optim.warmup_steps=1", "train.log_every=1",
        "train.progress=false", "train.tensorboard=false", "train.plots=false", "threads=1", "data.shuffle_buffer=0"]
BOUND = 6


def expected_cut(pages: list[dict], bound: int) -> dict:
    spans = [len(p["spans"]) for p in pages]
    boxes = [len(p["boxes"]) for p in pages]
    return {"views.max_spans": bound, "pages": len(pages),
            "pages_over_spans": sum(n > bound for n in spans), "spans_cut": sum(max(0, n - bound) for n in spans),
            "pages_over_boxes": sum(n > bound for n in boxes), "boxes_cut": sum(max(0, n - bound) for n in boxes)}


def test_max_spans_above_its_limit_is_refused_at_start_in_one_line(tmp_path, capsys):
    code = main(["pretrain", "views.max_spans=1000000", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert f"views.max_spans=1000000 is above the maximum {max_spans_limit(16, 384)}" in err and "GiB" in err
    assert not (tmp_path / "run").exists()
    assert max_spans_limit(16, 384) >= 32  # the default fits with room


def test_spans_and_boxes_cut_at_max_spans_are_counted_in_the_data_line_and_history(tmp_path, capsys):
    pages = list(generate_pages(8, seed=3, width=256, height=320))
    want = expected_cut(pages, BOUND)
    assert want["spans_cut"] > 0 and want["boxes_cut"] > 0  # the case is real
    write_shards(pages, tmp_path / "shards", pages_per_shard=4, progress=False)
    cfg = load_config("pretrain", None, TINY + [f"data.shards={tmp_path / 'shards'}", f"views.max_spans={BOUND}"])
    run = run_pretraining(cfg, tmp_path / "run")
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("[pretrain] data: "))
    assert (f"views.max_spans={BOUND} cuts {want['spans_cut']} spans on {want['pages_over_spans']} pages and "
            f"{want['boxes_cut']} boxes on {want['pages_over_boxes']} pages (of 8 pages)") in line
    start = next(h for h in read_history(run) if h["event"] == "start")
    assert start["bounds"] == want


def test_an_older_manifest_without_histograms_is_counted_from_the_page_records(tmp_path):
    pages = list(generate_pages(6, seed=4, width=256, height=320))
    write_shards(pages, tmp_path / "s", pages_per_shard=4, progress=False)
    manifest_path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert sum(manifest["pages_by_span_count"].values()) == 6
    for key in ("pages_by_span_count", "pages_by_box_count"):
        del manifest[key]
    manifest_path.write_text(json.dumps(manifest))
    for bound in (1, BOUND, 10_000):
        assert cut_at_max_spans(tmp_path / "s", bound) == expected_cut(pages, bound)


@pytest.mark.parametrize("batch, dim", [(16, 384), (1024, 384), (4096, 1024)])
def test_the_limit_keeps_a_batchs_text_rows_under_the_budget(batch, dim):
    limit = max_spans_limit(batch, dim)
    assert 1 <= limit <= 4096 and limit * batch * 2 * dim * 4 <= 2 << 30 or limit == 1
