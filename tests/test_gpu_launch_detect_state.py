"""Head-only detection leaves torch's process-wide determinism settings as it found them: the next
stage of the same process (the next ``ablate`` row) runs at full speed, and a user's own settings
survive. One real epoch of Ultralytics training on 8 synthetic pages."""
from __future__ import annotations

import os

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.detect.convert import pages_to_yolo
from gsdistill.detect.pipeline import train_head
from gsdistill.models.backbone import create_backbone, save_backbone
from gsdistill.tuples.sources.synthetic import generate_pages

TINY = {"name": "vit_tiny_patch16_224", "depth": 1, "embed_dim": 64, "num_heads": 2}


def _settings() -> tuple:
    import torch.utils.deterministic as deterministic
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic, deterministic.fill_uninitialized_memory,
            os.environ.get("CUBLAS_WORKSPACE_CONFIG"), os.environ.get("PYTHONHASHSEED"))


@pytest.fixture(scope="module")
def detect_cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("det_state")
    data = pages_to_yolo(generate_pages(8, seed=3, width=200, height=256), root / "data", val_fraction=0.25)
    backbone = save_backbone(create_backbone(TINY), TINY, root / "bb")
    return lambda name: load_config("detect", "cpu_smoke", [f"data={data}", f"backbone={backbone}", "epochs=1",
                                                           "imgsz=64", f"project={root / 'runs'}", f"name={name}"])


def test_deterministic_mode_does_not_outlive_training(detect_cfg, monkeypatch):
    # Ultralytics before 8.4 never switched it off again: what the installed one does is patched out
    import ultralytics.engine.trainer as trainer
    monkeypatch.setattr(trainer, "unset_deterministic", lambda: None)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    before = _settings()
    assert before[0] is False
    seen = []
    train_head(detect_cfg("old_ultralytics"), callbacks={
        "on_train_batch_start": [lambda t: seen.append(torch.are_deterministic_algorithms_enabled())]})
    assert seen and all(seen)  # on while training, as train_args asks
    assert _settings() == before


def test_a_users_own_settings_survive_training(detect_cfg, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        before = _settings()
        train_head(detect_cfg("user_settings"))
        after = _settings()
    finally:
        torch.use_deterministic_algorithms(False)
    assert after == before
