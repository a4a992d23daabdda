"""Issue 55 (detection), run folders: nothing a user owns is deleted, overwritten or mixed without their word.

1. a train run never writes over an earlier one; run, export, val and predict folders are locked and
   checked against what they read;
2. ``detect predict`` names every page uniquely (sub-folders kept) and never mixes its folder with
   predictions of other data unless ``--overwrite``;
3. a NaN backbone is refused, and a NaN loss stops training without a checkpoint from it.
(COCO entries and ``detect convert`` folders: ``test_reliability_round3_detect_convert.py``.)
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from folder_fixtures import hold, tree
from gsdistill.cli import main
from gsdistill.detect.convert import pages_to_yolo
from gsdistill.models.backbone import create_backbone, save_backbone
from gsdistill.tuples.sources.synthetic import generate_pages

TINY = {"name": "vit_tiny_patch16_224", "depth": 1, "embed_dim": 32, "num_heads": 2}
FAST = ["--config", "cpu_smoke", "imgsz=64", "adapter_channels=16", "random_backbone.depth=1",
        "random_backbone.embed_dim=32", "random_backbone.num_heads=2", "val_during_training=false"]

# --- 1. train / export / val folders ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    data = pages_to_yolo(generate_pages(8, seed=3, width=200, height=256), root / "det", val_fraction=0.25)
    runs = root / "runs"
    assert main(["detect", "train", *FAST, f"data={data}", f"project={runs}"]) == 0
    return data, runs


def test_training_again_under_an_existing_run_name_keeps_the_earlier_run(trained, capsys):
    data, runs = trained
    first = runs / "head_only"
    before = {n: (first / n).read_bytes() for n in ("weights/best.pt", "weights/last.pt", "results.csv")}
    capsys.readouterr()
    assert main(["detect", "train", *FAST, f"data={data}", f"project={runs}", "name=head_only"]) == 0
    chosen = Path(re.search(r"^\[detect\] run dir: (\S+)", capsys.readouterr().err, re.M).group(1))  # printed
    assert {n: (first / n).read_bytes() for n in before} == before
    assert chosen.parent == runs and chosen != first and (chosen / "weights" / "best.pt").is_file()


def test_resuming_a_run_another_process_writes_is_refused_with_its_pid(trained, capsys):
    _, runs = trained
    run = runs / "head_only"
    before = tree(run)
    holder = hold(run)
    try:
        assert main(["detect", "train", f"resume={run}"]) == 2
        assert f"PID {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert {k: v for k, v in tree(run).items() if k != ".gsdistill.lock"} == before


def test_project_that_is_a_file_is_one_line(trained, tmp_path, capsys):
    data, _ = trained
    (tmp_path / "afile").write_text("x")
    assert main(["detect", "train", *FAST, f"data={data}", f"project={tmp_path / 'afile'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "afile" in err
    assert (tmp_path / "afile").read_text() == "x"


def test_export_never_writes_over_a_trained_model(trained, capsys):
    _, runs = trained
    best = runs / "head_only" / "weights" / "best.pt"
    before = best.read_bytes()
    assert main(["detect", "export", *FAST, "--out", str(best)]) == 2
    assert best.read_bytes() == before and not (best.parent / "params.json").exists()


def test_export_and_predict_never_write_into_what_they_read(trained, tmp_path, capsys):
    _, runs = trained
    torch.manual_seed(0)
    bb = save_backbone(create_backbone(TINY), TINY, tmp_path / "bb")
    before = tree(bb)
    assert main(["detect", "export", *FAST, f"backbone={bb}", "--out", str(bb / "det.pt")]) == 2
    assert tree(bb) == before
    pages = tmp_path / "pages"
    pages.mkdir()
    Image.new("RGB", (64, 64), "white").save(pages / "p.png")
    before = tree(pages)
    best = str(runs / "head_only" / "weights" / "best.pt")
    for out in (pages, pages / "pred"):  # a drawn p.png would replace the page p.png
        assert main(["detect", "predict", best, str(pages), f"predict.out={out}"]) == 2
    assert main(["detect", "predict", best, str(pages / "p.png"), f"predict.out={pages}"]) == 2
    assert tree(pages) == before
    assert main(["detect", "predict", best, str(pages), f"predict.out={tmp_path / 'pred'}"]) == 0
    assert sorted(p.name for p in (tmp_path / "pred").iterdir()) == [".gsdistill-files", "p.json", "p.png"]


def test_val_report_folder_is_checked_against_its_inputs_and_locked(trained, tmp_path, capsys):
    from gsdistill.detect.evaluate import val_dir_name
    data, runs = trained
    best = runs / "head_only" / "weights" / "best.pt"
    split = data.parent / "images" / "val"
    before = tree(data.parent)
    # the report folder would lie in the evaluated split: its plots and label cache would become images
    assert main(["detect", "val", "--config", "cpu_smoke", str(best), str(data), f"project={split}"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1 and tree(data.parent) == before
    report_dir = tmp_path / "v" / val_dir_name(best)
    holder = hold(report_dir)
    try:
        assert main(["detect", "val", "--config", "cpu_smoke", str(best), str(data), f"project={tmp_path / 'v'}"]) == 2
        assert f"PID {holder.pid}" in capsys.readouterr().err
        assert sorted(p.name for p in report_dir.iterdir()) == [".gsdistill.lock"]
    finally:
        holder.kill()
        holder.wait()
    assert main(["detect", "val", "--config", "cpu_smoke", str(best), str(data), f"project={tmp_path / 'v'}"]) == 0
    assert (report_dir / "report.json").is_file()


def _pages(folder: Path, names: list[str]) -> Path:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (64, 64), "white").save(folder / name)
    return folder


def _predict(best: Path, source: Path, out: Path, *extra: str) -> int:
    return main(["detect", "predict", str(best), str(source), f"predict.out={out}", *extra])


# --- 2. predict: unique names, no mixing -----------------------------------------------------------

def test_predict_keeps_sub_folders_and_same_stems_apart(trained, tmp_path):
    best = trained[1] / "head_only" / "weights" / "best.pt"
    src = _pages(tmp_path / "src", ["a.png", "sub/a.png", "b.png", "b.jpg", "c.png"])
    out = tmp_path / "pred"
    assert _predict(best, src, out) == 0
    pages = {str(p.relative_to(out).with_suffix("")): json.loads(p.read_text())["page"] for p in out.rglob("*.json")}
    assert pages == {n: n for n in ("a", "sub/a", "b_png", "b_jpg", "c")}  # one page each, none written over
    assert {str(p.relative_to(out)) for p in out.rglob("*.png")} == {f"{n}.png" for n in pages}


def test_predict_refuses_a_folder_of_other_predictions_unless_overwrite(trained, tmp_path, capsys):
    best = trained[1] / "head_only" / "weights" / "best.pt"
    first = _pages(tmp_path / "first", ["p.png", "sub/q.png"])
    second = _pages(tmp_path / "second", ["p.png"])
    out = tmp_path / "pred"
    assert _predict(best, first, out) == 0
    (out / "NOTES.txt").write_text("mine")
    before = tree(out)
    capsys.readouterr()
    assert _predict(best, second, out) == 2  # its p.json would replace first's p.json
    assert len(capsys.readouterr().err.strip().splitlines()) == 1 and tree(out) == before
    assert _predict(best, first, out) == 0  # the same source and weights again: its own pages replaced
    assert "replacing 2 earlier predictions" in capsys.readouterr().err
    assert tree(out).keys() == before.keys()
    assert _predict(best, second, out, "--overwrite") == 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        ".gsdistill-files", "NOTES.txt", "p.json", "p.png"]  # the record of what gsdistill wrote there
    assert json.loads((out / "p.json").read_text())["source"] == str(second.resolve())
    assert (out / "NOTES.txt").read_text() == "mine"


def test_predict_never_writes_over_a_file_that_is_no_prediction(trained, tmp_path):
    best = trained[1] / "head_only" / "weights" / "best.pt"
    src = _pages(tmp_path / "src", ["p.png"])
    out = tmp_path / "pred"
    out.mkdir()
    (out / "p.png").write_bytes(b"my own picture")
    for extra in ((), ("--overwrite",)):
        assert _predict(best, src, out, *extra) == 2
    assert tree(out) == {"p.png": b"my own picture"}


# --- 3. non-finite weights and losses ---------------------------------------------------------------

@pytest.fixture()
def nan_backbone(tmp_path) -> Path:
    """An exported backbone folder whose weights file holds a NaN (a folder exported before the export
    refused them, or by another tool)."""
    from safetensors.torch import load_file, save_file
    torch.manual_seed(0)
    folder = save_backbone(create_backbone(TINY), TINY, tmp_path / "bb_nan")
    state = load_file(str(folder / "backbone.safetensors"))
    state["blocks.0.mlp.fc1.weight"][0, 0] = float("nan")
    save_file(state, str(folder / "backbone.safetensors"))
    return folder


def test_a_nan_backbone_is_refused_naming_its_folder(trained, nan_backbone, tmp_path, capsys):
    data, _ = trained
    assert main(["detect", "export", f"backbone={nan_backbone}", "adapter_channels=16", "--out",
                 str(tmp_path / "det.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(nan_backbone) in err and not (tmp_path / "det.pt").exists()
    runs = tmp_path / "runs"
    assert main(["detect", "train", *FAST, f"data={data}", f"backbone={nan_backbone}", f"project={runs}"]) == 2
    assert str(nan_backbone) in capsys.readouterr().err
    assert not list(runs.rglob("*.pt"))


def test_a_detector_file_with_nan_weights_is_refused(trained, tmp_path, capsys):
    from gsdistill.config import load_config
    from gsdistill.detect.pipeline import build_detector
    data, runs = trained
    cfg = load_config("detect", "cpu_smoke", FAST[2:])
    det = build_detector(None, 5, cfg)
    with torch.no_grad():
        next(det.model.model[1].parameters()).fill_(float("nan"))  # the pyramid (head side)
    det.save(str(tmp_path / "nan.pt"))
    model, runs = f"model={tmp_path / 'nan.pt'}", f"project={tmp_path / 'r'}"
    for argv in (["detect", "train", *FAST, f"data={data}", model, runs],
                 ["detect", "val", str(tmp_path / "nan.pt"), str(data)]):
        assert main(argv) == 2
        assert str(tmp_path / "nan.pt") in capsys.readouterr().err
    assert not (tmp_path / "r").exists() or list((tmp_path / "r").iterdir()) == []  # no run folder stays behind


def test_a_nan_loss_stops_training_with_exit_1_and_no_checkpoint(trained, tmp_path, monkeypatch, capsys):
    from gsdistill.detect import pipeline
    data, _ = trained
    attach = pipeline.add_run_callbacks

    def poisoned(model, run_dir):  # the head turns NaN once training starts (as a too-large lr would)
        attach(model, run_dir)
        model.add_callback("on_train_start", lambda tr: next(tr.model.model[1].parameters()).data.fill_(float("nan")))

    monkeypatch.setattr(pipeline, "add_run_callbacks", poisoned)
    runs = tmp_path / "runs"
    assert main(["detect", "train", *FAST, f"data={data}", f"project={runs}"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("gsdistill detect train: ") and str(runs / "head_only") in last
    assert not list(runs.rglob("*.pt"))  # no best.pt / last.pt of NaN-turned-zero weights
