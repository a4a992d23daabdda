"""Head-only training with Ultralytics' trainer on tiny synthetic pages: frozen backbone, resume, val, predict.

One interrupted + resumed 2-epoch run (module fixture) is shared by the tests below.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.detect.convert import pages_to_yolo
from gsdistill.detect.pipeline import train_head, validate
from gsdistill.models.backbone import create_backbone, save_backbone

TINY = {"name": "vit_tiny_patch16_224", "depth": 2, "embed_dim": 64, "num_heads": 2, "drop_path_rate": 0.3}


class Interrupt(Exception):
    """Raised by a callback to stop training after the first epoch, as a crash would."""


def _state(pt: Path) -> dict:
    from ultralytics import YOLO
    return {k: v.clone() for k, v in YOLO(str(pt)).model.state_dict().items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    data = pages_to_yolo(generate_pages(8, seed=3, width=200, height=256), root / "data", val_fraction=0.25)
    torch.manual_seed(0)
    bb = save_backbone(create_backbone(TINY), TINY, root / "bb")
    cfg = load_config("detect", "cpu_smoke", [f"data={data}", f"backbone={bb}", f"project={root / 'runs'}",
                                              "epochs=2", "imgsz=128", "lr0=0.01"])
    seen = {"backbone_training": set(), "head_training": set()}

    def watch(trainer):
        seen["backbone_training"] |= {m.training for m in trainer.model.model[0].modules()}
        seen["head_training"].add(trainer.model.model[-1].training)

    def stop(trainer):
        if trainer.epoch == 1:
            raise Interrupt()

    with pytest.raises(Interrupt):
        train_head(cfg, callbacks={"on_train_batch_start": [watch], "on_train_epoch_start": [stop]})
    run_dir = root / "runs" / "head_only"
    first = list(csv.DictReader(open(run_dir / "results.csv")))
    resumed = load_config("detect", "cpu_smoke", [f"resume={run_dir}"])
    assert train_head(resumed, callbacks={"on_train_batch_start": [watch]}) == run_dir
    return {"root": root, "data": data, "dir": run_dir, "cfg": cfg, "seen": seen, "first_rows": first}


def test_backbone_frozen_bit_identical_and_in_eval_mode(run):
    init, best, last = (_state(p) for p in (run["dir"] / "init/detector.pt", run["dir"] / "weights/best.pt",
                                            run["dir"] / "weights/last.pt"))
    vit_keys = [k for k in init if k.startswith("model.0.")]
    assert vit_keys and all(torch.equal(init[k], best[k]) and torch.equal(init[k], last[k]) for k in vit_keys)
    head_keys = [k for k in init if k.startswith(("model.1.", "model.5.")) and init[k].is_floating_point()]
    assert any(not torch.equal(init[k], last[k]) for k in head_keys)  # the head did train
    assert run["seen"]["backbone_training"] == {False} and run["seen"]["head_training"] == {True}
    params = json.loads((run["dir"] / "params.json").read_text())
    vit_n = sum(p.numel() for p in create_backbone(TINY).parameters())
    dfl_n = 16  # v10Detect's fixed DFL conv (reg_max=16), always frozen by Ultralytics
    assert params["params_trainable"] == params["params_total"] - vit_n - dfl_n


def test_resume_continues_the_interrupted_run(run):
    rows = list(csv.DictReader(open(run["dir"] / "results.csv")))
    assert len(run["first_rows"]) == 1 and [int(float(r["epoch"])) for r in rows] == [1, 2]
    assert rows[0] == run["first_rows"][0]  # the first epoch was not re-run
    assert (run["dir"] / "plots/training.png").is_file() and any((run["dir"] / "tensorboard").iterdir())
    assert (run["dir"] / "config.yaml").is_file()
    report = json.loads((run["dir"] / "report.json").read_text())  # counted across the interruption
    nb = report["batches_per_epoch"]  # nbs defaults to batch: one optimizer step per batch
    assert report["nbs"] == report["batch"] == 4 and report["steps_at_epoch"] == [nb, 2 * nb]
    assert report["optimizer_steps"] == 2 * nb and report["epochs_done"] == 2 and report["imgsz"] == 128
    from ultralytics import YOLO
    meta = YOLO(str(run["dir"] / "weights/best.pt")).model.yaml["gsdistill"]  # config inside the checkpoint
    assert meta["config"]["adapter_channels"] == 32 and meta["backbone"] == str(run["root"] / "bb")


def test_validate_reports_ultralytics_and_pycocotools(run):
    # imgsz left at the default 640: val must take the checkpoint's training size (128)
    cfg = load_config("detect", "cpu_smoke", [f"project={run['root'] / 'val'}", "imgsz=640"])
    rep = validate(run["dir"] / "weights/best.pt", run["data"], cfg=cfg)
    assert rep["imgsz"] == 128
    explicit = load_config("detect", "cpu_smoke", [f"project={run['root'] / 'val'}", "val.imgsz=96"])
    assert validate(run["dir"] / "weights/best.pt", run["data"], cfg=explicit)["imgsz"] == 96
    present = [n for n, ap in rep["per_class"].items() if ap["AP50"] is not None]
    assert present and all("coco_AP50" in rep["per_class"][n] for n in present)
    # Ultralytics' mAP is the mean of its per-class APs over the classes with ground truth
    for key in ("AP50", "AP50-95"):
        per_class = [rep["per_class"][n][key] for n in present]
        assert rep["m" + key] == pytest.approx(sum(per_class) / len(per_class), abs=1e-9), key
    # pycocotools numbers recomputed here from the saved predictions and the converter's sidecar
    coco = _cocoeval(rep["save_dir"], run["data"])
    assert (rep["coco_mAP50"], rep["coco_mAP50-95"]) == pytest.approx(coco, abs=1e-12)
    assert json.loads(Path(rep["save_dir"], "report.json").read_text())["mAP50"] == rep["mAP50"]


def _cocoeval(save_dir: str, data_yaml: str) -> tuple[float, float]:
    """(AP@50, AP@[50:95]) of ``save_dir/predictions.json`` with pycocotools, straight from the files."""
    import contextlib
    import io

    import yaml
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    side = json.loads((Path(data_yaml).parent / "coco_eval.json").read_text())["val"]
    names = yaml.safe_load(Path(data_yaml).read_text())["names"]
    names = list(names.values()) if isinstance(names, dict) else names
    assert len(side["category_ids"]) == len(names)
    dets = [{"image_id": side["image_ids"][Path(p["file_name"]).stem], "bbox": p["bbox"], "score": p["score"],
             "category_id": side["category_ids"][p["category_id"] - 1]}
            for p in json.loads(Path(save_dir, "predictions.json").read_text())]
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(side["coco_json"])
        ev = COCOeval(gt, gt.loadRes([d for d in dets if d["category_id"] is not None]), "bbox")
        ev.params.imgIds = sorted(side["image_ids"].values())
        ev.params.catIds = sorted({c for c in side["category_ids"] if c is not None})
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[1]), float(ev.stats[0])


def test_predict_cli_on_png_and_pdf_in_a_new_process(run, tmp_path):
    import pymupdf as fitz
    png = next((Path(run["data"]).parent / "images/val").iterdir())
    doc = fitz.open()
    doc.new_page(width=200, height=256).insert_text((20, 40), "Section 1")
    doc.save(tmp_path / "doc.pdf")
    src = tmp_path / "src"
    src.mkdir()
    (src / "page.png").write_bytes(png.read_bytes())
    (src / "doc.pdf").write_bytes((tmp_path / "doc.pdf").read_bytes())
    out = tmp_path / "pred"
    cmd = [sys.executable, "-m", "gsdistill.cli", "detect", "predict", str(run["dir"] / "weights/best.pt"), str(src),
           "predict.conf=0.0", "predict.max_det=5", "predict.dpi=72", f"predict.out={out}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir() if p.name != ".gsdistill-files") == [  # (the record of what
        "doc_p0000.json", "doc_p0000.png", "page.json", "page.png"]                    # gsdistill wrote there)
    page = json.loads((out / "page.json").read_text())
    assert len(page["boxes"]) == 5 and {"category", "bbox", "score", "class_id"} <= set(page["boxes"][0])
    assert page["imgsz"] == 128  # the checkpoint's training size, not the 640 default
    bad = subprocess.run(cmd[:6] + [str(tmp_path / "absent.pdf")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "absent.pdf does not exist" in bad.stderr


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gsdistill.cli", "detect", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_convert_export_val_and_bad_input(run, tmp_path):
    conv = _cli("convert", "--synthetic", "6", "--size", "200", "256", "--val-fraction", "0.5",
                "--out", str(tmp_path / "syn"))
    assert conv.returncode == 0, conv.stderr[-2000:]
    counts = [int(line.split()[1]) for line in conv.stdout.splitlines() if line.startswith(("train:", "val:"))]
    assert sum(counts) == 6 and min(counts) > 0 and (tmp_path / "syn/data.yaml").is_file()
    exp = _cli("export", "--names", "publaynet", "--out", str(tmp_path / "x.pt"), "adapter_channels=16",
               "random_backbone.depth=1", "random_backbone.embed_dim=32", "random_backbone.num_heads=2")
    assert exp.returncode == 0 and "trainable" in exp.stdout, exp.stderr[-2000:]
    val = _cli("val", str(run["dir"] / "weights/best.pt"), str(tmp_path / "syn/data.yaml"), "imgsz=128",
               f"project={tmp_path / 'v'}")
    assert val.returncode == 0 and "COCO50-95" in val.stdout and "Text" in val.stdout, val.stderr[-2000:]
    missing = _cli("train", f"data={tmp_path / 'nope.yaml'}", f"project={tmp_path}")
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr
    typo = _cli("train", "epoch=3")
    assert typo.returncode == 2 and "did you mean 'epochs'" in typo.stderr
