"""Reliability of the detection stage (issue 12 items 10-11): untrusted .pt files, run logging, report folders,
export over an existing params.json; and the optimizer steps / imgsz that the run and val reports record."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.detect.evaluate import val_dir_name
from gsdistill.detect.pipeline import export_detector, train_args, train_head
from gsdistill.detect.safe_load import UnsafeCheckpointError, load_yolo

SMALL = ["random_backbone.depth=1", "random_backbone.embed_dim=32", "random_backbone.num_heads=2",
         "adapter_channels=16"]


class _Payload:
    """Unpickling this runs ``touch <marker>``: what a crafted checkpoint does."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_crafted_pt_is_refused_and_its_payload_never_runs(tmp_path):
    marker = tmp_path / "payload_ran"
    evil = tmp_path / "evil.pt"
    torch.save({"model": _Payload(marker), "train_args": {}}, evil)
    (tmp_path / "pages").mkdir()  # a source folder beside predict.out, not holding it
    (tmp_path / "pages" / "page.png").write_bytes(b"")  # never read: loading fails first
    res = subprocess.run([sys.executable, "-m", "gsdistill.cli", "detect", "predict", str(evil),
                          str(tmp_path / "pages"), f"predict.out={tmp_path / 'out'}"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "YOLO_OFFLINE": "1"})
    assert not marker.exists(), "the pickle payload ran"
    assert res.returncode == 2 and "evil.pt: refused to load" in res.stderr and "system" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1  # one line, no traceback
    with pytest.raises(UnsafeCheckpointError, match="untrusted source is a program"):
        load_yolo(evil)
    assert not marker.exists()


def test_own_detector_loads_safely_with_its_layers(tmp_path):
    cfg = load_config("detect", None, SMALL)
    pt = export_detector(None, ["a", "b"], cfg, tmp_path / "det.pt")
    model = load_yolo(pt)  # weights_only path: timm and gsdistill classes allowed, nothing else
    assert type(model.model.model[0]).__name__ == "ViTBackbone" and model.model.model[0].normalize
    from ultralytics.nn import tasks
    assert tasks.SAFE_LOAD is False  # restricted loading is switched on for the call only


def test_export_refuses_to_replace_another_files_params_json(tmp_path):
    cfg = load_config("detect", None, SMALL)
    first = export_detector(None, ["a", "b"], cfg, tmp_path / "one.pt")
    before = (tmp_path / "params.json").read_text()
    with pytest.raises(FileExistsError, match="params.json already exists and describes .*one.pt"):
        export_detector(None, ["a", "b", "c"], cfg, tmp_path / "two.pt")
    assert (tmp_path / "params.json").read_text() == before and not (tmp_path / "two.pt").exists()
    export_detector(None, ["a", "b"], cfg, first)  # re-exporting the same file replaces its own params.json
    assert json.loads((tmp_path / "params.json").read_text())["weights"] == str(first.resolve())


def test_val_report_folder_is_unique_per_weights_path(tmp_path):
    a, b = tmp_path / "run1/weights/best.pt", tmp_path / "run2/weights/best.pt"
    assert val_dir_name(a) != val_dir_name(b)
    assert val_dir_name(a).startswith("run1_best_") and val_dir_name(a) == val_dir_name(str(a))


def test_one_tensorboard_writer_per_run_closed_at_the_end(tmp_path, monkeypatch):
    import torch.utils.tensorboard as tb

    from gsdistill.detect import run_logging

    made = []

    class CountingWriter(tb.SummaryWriter):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)
            self.closed = False

        def close(self):
            self.closed = True
            super().close()

    monkeypatch.setattr(tb, "SummaryWriter", CountingWriter)

    class FakeModel:
        callbacks: dict = {}

        def add_callback(self, event, fn):
            self.callbacks.setdefault(event, []).append(fn)

    class FakeTrainer:
        tloss, metrics, epochs, start_epoch, batch_size, accumulate, save_dir = None, {"m": 0.5}, 3, 0, 4, 1, tmp_path
        args = type("A", (), {"imgsz": 64, "nbs": 4, "freeze": [0]})()
        train_loader = type("Loader", (list,), {"dataset": [0] * 8})([0, 1])
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def label_loss_items(self, loss, prefix):
            return {f"{prefix}/box": 1.0}

    model, trainer = FakeModel(), FakeTrainer()
    run_logging.add_run_callbacks(model, tmp_path)
    model.callbacks["on_train_start"][0](trainer)
    for epoch in range(3):
        trainer.epoch = epoch
        trainer.optimizer.step()  # one optimizer step per epoch here
        model.callbacks["on_fit_epoch_end"][0](trainer)
    model.callbacks["on_train_end"][0](trainer)
    model.callbacks["teardown"][0](trainer)
    assert len(made) == 1 and made[0].closed
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["optimizer_steps"] == 3 and report["steps_at_epoch"] == [1, 2, 3] and report["imgsz"] == 64


def test_nbs_sets_the_optimizer_steps_the_run_report_counts(tmp_path):
    """batch 4, nbs 8, no warm-up: Ultralytics steps after every 2nd batch; nbs null steps every batch."""
    from gsdistill.tuples.sources.synthetic import generate_pages
    from gsdistill.detect.convert import pages_to_yolo

    data = pages_to_yolo(generate_pages(6, seed=1, width=200, height=224, pages_per_doc=1), tmp_path / "data",
                         val_fraction=0.34)
    base = ["epochs=2", "imgsz=64", "batch=4", "workers=0", "warmup_epochs=0", "val_during_training=false",
            f"data={data}", f"project={tmp_path / 'runs'}", *SMALL]
    steps = {}
    for nbs in ("8", "null"):
        cfg = load_config("detect", "cpu_smoke", [*base, f"nbs={nbs}", f"name=nbs{nbs}"])
        run = train_head(cfg)
        report = json.loads((run / "report.json").read_text())
        assert report["batches_per_epoch"] == 1 and report["imgsz"] == 64  # 4 train pages, batch 4
        steps[nbs] = (report["optimizer_steps"], report["accumulate"])
    assert steps == {"8": (1, 2), "null": (2, 1)}  # 2 batches in all: one step of 2, or two of 1
    assert train_args(load_config("detect", None, ["batch=5"]), "d.yaml", tmp_path / "r")["nbs"] == 5
