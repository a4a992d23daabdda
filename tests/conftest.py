"""Shared test fixtures: the real data sets beside the repo (../shared/data) and offline settings."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / ".cache" / "torch_extensions"))


def shared_data_dir() -> Path:
    """``$GSDISTILL_SHARED_DATA`` or ``../shared/data`` beside the checkout."""
    env = os.environ.get("GSDISTILL_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Folder of the real third-party data sets; tests using it skip where it is absent."""
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"real data sets not found at {path} (set GSDISTILL_SHARED_DATA); "
                    "they ship beside the repo in CI, not in a user's clone")
    return path


@pytest.fixture
def stream_views_kwargs(monkeypatch):
    """``(shard_dir, cfg) -> kwargs``: what the pretraining stream (``ShardBatches``) passes to
    ``MultiCropViews`` for ``cfg``, recorded by a subclass patched in for the test."""
    import gsdistill.views.multicrop as multicrop
    from gsdistill.pretrain.data_stream import ShardBatches
    seen = {}

    class Recording(multicrop.MultiCropViews):
        def __init__(self, **kwargs):
            seen.update(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr(multicrop, "MultiCropViews", Recording)

    def record(shard_dir, cfg) -> dict:
        seen.clear()
        ShardBatches(str(shard_dir), cfg, 0, 1, 2, 16)._epoch_iterator(0)
        return dict(seen)
    return record


@pytest.fixture
def student_passes():
    """``(model, batch) -> (terms, rows)``: the loss terms of one forward and the batch size of each
    student backbone call (hooked on its first block), to check how many passes a term costs."""
    def run(model, batch):
        rows = []
        hook = model.backbone.blocks[0].register_forward_hook(lambda m, i, o: rows.append(o.shape[0]))
        try:
            return model(batch), rows
        finally:
            hook.remove()
    return run


@pytest.fixture
def draw_ruled_table():
    """Draws a booktabs-like two-column table (three rules, four rows) at (150, 520)-(460, 592) pt on a pymupdf page."""
    def draw(page) -> None:
        for ry in (520, 538, 592):
            page.draw_line((150, ry), (460, ry), width=0.6)
        for i, (a, b) in enumerate([("Name", "Value"), ("alpha", "1.0"), ("beta", "2.0"), ("gamma", "3.0")]):
            page.insert_text((160, 533 + i * 18), a, fontsize=10)
            page.insert_text((380, 533 + i * 18), b, fontsize=10)
    return draw
