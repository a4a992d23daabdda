"""`gsdistill demo --pdfs DIR` on real PDFs at toy size: the real-page recipe is picked, every stage runs
(span-centred local views asked for here, 5-class detection, human-labelled pages), and the report states what it measured."""
from __future__ import annotations

import json
import shutil

import pytest

from gsdistill.config import load_config
from gsdistill.pipelines import demo
from gsdistill.tuples.labels import PUBLAYNET_CLASSES

SMOKE = ["data.max_pdf_pages=16", "data.pages_per_pdf=4", "data.eval_fraction=0.5", "data.pdf_dpi=36",
         "data.retrieval_train_pages=8", "detect_seeds=[0]", "detect_reference=null", "predict_pages=1",
         "detect=[epochs=1,imgsz=128,batch=8]",
         "pretrain=[optim.steps=4,optim.batch_size=4,optim.warmup_steps=1,model.backbone.depth=1,views.global_size=64,"
         "views.local_mode=spans,views.local_size=32,views.local_span_px=48,model.dino_out_dim=64,"
         "model.dino_hidden_dim=32,model.dino_bottleneck_dim=16,train.ckpt_every=4,train.log_every=2]"]


def test_pdfs_pick_the_real_page_recipe(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda cfg, **_: seen.update(cfg=cfg) or tmp_path / "report.md")
    assert demo.main(["--pdfs", str(tmp_path)]) == 0
    cfg = seen["cfg"]
    assert cfg.detect_labels == "publaynet" and cfg.data.detect_train_pages is None
    assert "views.local_mode=random" in cfg.pretrain  # what its measured runs trained (docs/learning.md)
    demo.main(["--pdfs", str(tmp_path), "--size", "smoke"])  # a named size wins
    assert seen["cfg"].detect_labels == "doclaynet"


@pytest.fixture(scope="module")
def pdf_demo(tmp_path_factory, request):
    shared = request.getfixturevalue("shared_data")
    root = tmp_path_factory.mktemp("pdfdemo")
    pdfs, labels, extra = root / "pdfs", root / "human", root / "extra"
    for d in (pdfs, labels, extra):
        d.mkdir()
    papers = sorted((shared / "arxiv_pdfs_docbank").glob("*.pdf"))
    for f in papers[:3]:
        shutil.copy(f, pdfs / f.name)
    # detection-only pages: one other paper, and a copy of one of --pdfs under another name (it may be held out)
    shutil.copy(papers[3], extra / papers[3].name)
    shutil.copy(papers[0], extra / "renamed_copy.pdf")
    (labels / "publaynet_examples").symlink_to(shared / "publaynet_examples")
    cfg = load_config("demo", "pdfs", [*SMOKE, f"pdfs={pdfs}", f"out_dir={root / 'out'}", f"human_labels={labels}",
                                       f"detect_extra_pdfs={extra}"])
    return root / "out", demo.run_demo(cfg)


def test_pdf_demo_runs_every_stage_on_real_pages(pdf_demo):
    out, report = pdf_demo
    res = json.loads((out / "results.json").read_text())
    assert res["detect"]["labels"] == PUBLAYNET_CLASSES
    data_yaml = json.loads((out / "detect" / "data" / "manifest.json").read_text())
    assert data_yaml["names"] == PUBLAYNET_CLASSES
    hl = res["human_labels"]["PubLayNet examples"]
    assert hl["images"] == 20 and {r["backbone"] for r in hl["rows"]} == {"pretrained", "random backbone"}
    assert all(0.0 <= r["map50"] <= 1.0 for r in hl["rows"])
    text = report.read_text()
    assert "## 3b. The same detectors on pages with human layout labels" in text
    assert "**PubLayNet examples** (20 pages)" in text
    assert "32 px local views of about 48 page px around a text span" in text
    assert "log K = " in text and "more than the seed spread" not in text


def test_extra_pdfs_train_the_heads_only_at_the_same_steps(pdf_demo):
    out, report = pdf_demo
    res = json.loads((out / "results.json").read_text())
    extra = res["data"]["detection-only pages (detect_extra_pdfs)"]
    assert extra["documents"] == 1 and extra["pages"] == 4  # data.pages_per_pdf of the one new paper
    skipped = json.loads((out / "data" / "detect_extra" / "manifest.json").read_text())["skipped"]
    assert [s["reason"].split(" of --pdfs")[0] for s in skipped if s["source"].endswith("renamed_copy.pdf")] == [
        f"the same file as {out.parent / 'pdfs' / sorted(p.name for p in (out.parent / 'pdfs').iterdir())[0]}"]
    assert res["detect"]["train_pages"]["extra"] == 4
    stems = {s: {p.stem for p in (out / "detect" / "data" / "labels" / s).glob("*.txt")} for s in ("train", "val")}
    assert sum("detect-extra" in s for s in stems["train"]) == 4 and not any("detect-extra" in s for s in stems["val"])
    from gsdistill.pipelines.demo_pdfs import same_steps_overrides
    from gsdistill.tuples.store.reader import read_pages
    assert not any(p["doc_id"].startswith("detect-extra/") for p in read_pages(out / "data" / "train", decode_images=False))
    n = res["detect"]["train_pages"]["pretraining"]
    assert res["detect"]["overrides"][-2:] == same_steps_overrides(load_config("detect", "compare", ["epochs=1", "batch=8"]), n, n + 4)
    assert "pages of other documents (`detect_extra_pdfs`" in report.read_text()


def test_same_steps_overrides_keep_the_optimizer_and_warm_up_steps():
    from gsdistill.pipelines.demo_pdfs import same_steps_overrides

    dcfg = load_config("detect", "compare", ["epochs=16", "batch=16", "warmup_epochs=1.0"])
    # the long benchmark: 1,138 pretraining pages (72 batches) and 2,930 more (255 batches in all)
    assert same_steps_overrides(dcfg, 1138, 1138 + 2930) == ["epochs=5", f"warmup_epochs={72 / 255:.4g}"]
    assert 5 * 255 >= 16 * 72 > 4 * 255  # at least the steps, by less than one epoch
    assert same_steps_overrides(dcfg, 100, 100) == ["epochs=16", "warmup_epochs=1"]


def test_long_benchmark_recipe_loads_and_its_script_names_a_missing_folder(tmp_path):
    import os
    import subprocess
    from pathlib import Path

    cfg = load_config("demo", "pdfs_long", ["pdfs=/x"])
    assert cfg.detect_reference_curve and cfg.detect_labels == "publaynet" and cfg.data.detect_train_pages is None
    assert "views.local_mode=random" in cfg.pretrain  # what its measured runs trained (docs/learning.md)
    # the patch-spread weight the long benchmark measured (docs/learning.md, "The patch-spread weight")
    pcfg = demo.pretrain_config(cfg, tmp_path)  # the pretraining config the demo's own stage resolves
    assert pcfg.objective.patch_spread and pcfg.objective.lambda_patch_spread == 4.0
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PDFS": str(tmp_path / "none")}
    done = subprocess.run(["bash", str(root / "tools" / "experiments" / "real_pages_bench.sh")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 2 and f"no PDF folder at {tmp_path / 'none'}" in done.stderr


def test_reference_curve_only_for_runs_validated_every_epoch(tmp_path):
    from gsdistill.pipelines.demo_report_detect import reference_curve
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "detect").mkdir()
    (run / "results.csv").write_text("epoch,time,metrics/mAP50(B)\n1,60,0.1\n2,120,0.25\n")
    row = {"backbone": "yolov10n.yaml (stock)", "seed": 0, "run_dir": str(run)}
    assert reference_curve([row], tmp_path) == []  # no per-epoch validation: the csv's mAP is not a curve
    lines = reference_curve([{**row, "curve": True}], tmp_path)
    assert "1 min 10.0 %, 2 min 25.0 %" in lines[0] and (tmp_path / "detect" / "reference_curve_s0.png").is_file()
