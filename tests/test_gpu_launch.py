"""The real launchers on the CPU, as a GPU cluster runs them: ``deepspeed --num_gpus 2 --module
gsdistill.cli pretrain ...`` (DeepSpeed's CPU accelerator, gloo) in fp32 and bf16, and
``torchrun --nproc_per_node 2`` in fp32 and bf16, on synthetic pages read by 2 DataLoader workers
a rank.
DeepSpeed fp32 equals the torch engine; bf16 starts where fp32 does and saves fp32 weights, the
teacher's included; a bf16 DeepSpeed run resumed from its checkpoint gives the same losses."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gsdistill.pretrain.metrics_log import read_metrics
from test_pretrain_data import TINY
from test_pretrain_distributed import _spawn

BIN = Path(sys.executable).parent
TERMS = ("total", "sem", "geom", "distill", "ibot", "koleo", "grad_norm", "weight_norm")
pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _launch(launcher: list[str], run_dir: Path, overrides: list[str]) -> list[dict]:
    cmd = [*launcher, "gsdistill.cli", "pretrain", "--run-dir", str(run_dir), *TINY, "data.num_workers=2", *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "[pretrain] device cpu, precision" in done.stdout
    return [{k: float(v) for k, v in row.items()} for row in read_metrics(run_dir / "metrics.csv")]


DEEPSPEED = [str(BIN / "deepspeed"), "--num_gpus", "2", "--module"]
TORCHRUN = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    pytest.importorskip("deepspeed")
    root = tmp_path_factory.mktemp("launch")
    return {
        "torchrun fp32": _launch(TORCHRUN, root / "tr32", []),
        "torchrun bf16": _launch(TORCHRUN, root / "tr16", ["train.precision=bf16"]),
        "deepspeed fp32": _launch(DEEPSPEED, root / "ds32", ["train.engine=deepspeed"]),
        "deepspeed bf16": _launch(DEEPSPEED, root / "ds16", ["train.engine=deepspeed", "train.precision=bf16"]),
        "root": root,
    }


def test_deepspeed_launcher_fp32_equals_torchrun(runs):
    ds, ref = runs["deepspeed fp32"], runs["torchrun fp32"]
    assert [r["step"] for r in ds] == [r["step"] for r in ref] == [1, 2, 3]
    for a, b in zip(ds, ref):
        for term in TERMS:
            assert a[term] == pytest.approx(b[term], rel=1e-4, abs=1e-5), (a["step"], term)


@pytest.mark.parametrize("name", ["deepspeed bf16", "torchrun bf16"])
def test_bf16_launch_trains_from_where_fp32_starts(runs, name):
    run, ref = runs[name], runs["torchrun fp32"]
    assert [r["step"] for r in run] == [1, 2, 3]
    assert all(math.isfinite(r[t]) for r in run for t in TERMS)
    for term in ("total", "sem", "geom", "distill", "koleo"):  # step 1: the same weights, bf16 arithmetic
        assert run[0][term] == pytest.approx(ref[0][term], rel=3e-2), (name, term)


def test_deepspeed_bf16_saves_fp32_masters_student_and_teacher(runs):
    state = load_file(str(runs["root"] / "ds16" / "checkpoints" / "step-000003" / "model.safetensors"))
    for prefix in ("teacher.backbone.", "backbone.", "teacher.dino_head."):
        weights = [v for k, v in state.items() if k.startswith(prefix) and v.is_floating_point()]
        assert weights and all(v.dtype == torch.float32 for v in weights)
        # trained in fp32 (bf16 is autocast, not the weights): values that bf16 cannot hold
        assert any(not torch.equal(v, v.bfloat16().float()) for v in weights), prefix


def test_deepspeed_bf16_resume_restores_the_fp32_teacher(tmp_path):
    """A fast-moving teacher (momentum 0.9, lr 1e-2) resumed after step 2 ends where the run without
    a stop ends: the losses agree to 1e-3 (bf16 magnifies any rounding difference of the restored
    state, tests/test_gpu_engines.py) and the teacher to a hundredth of how far it moved."""
    pytest.importorskip("deepspeed")
    bf16 = ["train.engine=deepspeed", "train.precision=bf16", "optim.lr=1e-2", "objective.momentum_base=0.9",
            "objective.momentum_end=0.9"]
    full = _spawn(1, bf16, tmp_path / "full")
    _spawn(1, [*bf16, "train.stop_after=2"], tmp_path / "part")
    resumed = _spawn(1, [*bf16, f"train.resume={tmp_path / 'part'}"], tmp_path / "part")
    for step, row in full["rows"].items():
        for term in ("total", "sem", "geom", "distill", "ibot", "koleo"):
            assert resumed["rows"][step][term] == pytest.approx(row[term], rel=1e-3), (step, term)
    a, b = (load_file(str(d / "checkpoints" / "step-000004" / "model.safetensors")) for d in (tmp_path / "full",
                                                                                                tmp_path / "part"))
    start = load_file(str(tmp_path / "part" / "checkpoints" / "step-000002" / "model.safetensors"))
    teacher = [k for k in a if k.startswith("teacher.")]
    moved = max(float((a[k] - start[k]).abs().max()) for k in teacher)
    diff = max(float((a[k] - b[k]).abs().max()) for k in teacher)
    print(f"teacher after resume: max |diff| {diff:.3g}, moved {moved:.3g} in steps 3-4")
    assert diff < moved / 100


def test_deepspeed_bf16_two_processes_with_patch_spread(tmp_path):
    """The real-page recipe's extra parts under the user's launcher: 2 DeepSpeed processes, bf16; the
    patch_spread term is logged every step, finite and float32-computed (its statistics are per rank, as
    documented); the separate iBOT head and its teacher copy are saved as fp32 masters."""
    pytest.importorskip("deepspeed")
    rows = _launch(DEEPSPEED, tmp_path / "ds16ps", ["train.engine=deepspeed", "train.precision=bf16",
                                                    "objective.patch_spread=true", "model.ibot_separate_head=true"])
    state = load_file(str(tmp_path / "ds16ps" / "checkpoints" / "step-000003" / "model.safetensors"))
    for prefix in ("ibot_head.", "teacher.ibot_head."):
        weights = [v for k, v in state.items() if k.startswith(prefix) and v.is_floating_point()]
        assert weights and all(v.dtype == torch.float32 for v in weights), prefix
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r[t]) for r in rows for t in (*TERMS, "patch_spread"))
    assert all(0 < r["patch_spread"] < 2 for r in rows)  # variance hinge <= 1 plus a small covariance part
