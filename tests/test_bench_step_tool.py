"""``tools/bench/bench_step.py``'s shared batch is what the training loop feeds the model: the views
pipeline's masks plus the host indices ``to_device`` adds. Without those indices the model runs
``nonzero``, which breaks a compiled step's graph (the CPU compile once measured 3x slower for it)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from gsdistill.config import load_config
from gsdistill.pretrain.data_stream import host_indices, to_device

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench" / "bench_step.py"


def _tool():
    spec = importlib.util.spec_from_file_location("bench_step", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shared_batch_carries_the_loops_host_indices():
    tool = _tool()
    cfg = load_config("pretrain", None, tool.overrides_of("pdfs"))
    batch = tool.shared_batch(cfg, 2)
    want = host_indices(batch["masks"])
    assert batch["masks"].any()  # some view is masked, so the indices are not trivially empty
    for key, value in want.items():
        assert torch.equal(batch[key], value), key
    fed = to_device({k: v for k, v in batch.items() if k not in want}, torch.device("cpu"))
    for key in want:  # the same indices as the loop's own to_device computes
        assert torch.equal(fed[key], batch[key]), key
