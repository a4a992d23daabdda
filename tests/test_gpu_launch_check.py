"""``tools/gpu_check.sh --cpu`` runs end to end at tiny sizes (as CI keeps it working): both engines
in bf16, the agreement runs against the CPU fp32 reference, the profile row, one epoch of head-only
detection, the markdown tables and the seconds of every part (the GPU-only parts are skipped)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.mark.distributed
def test_gpu_check_cpu_writes_the_table(tmp_path):
    pytest.importorskip("deepspeed")
    # run as from a user's clean shell: launcher variables (RANK, MASTER_PORT, ...) that earlier in-process
    # tests leave in this process must not reach the runs the script launches
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "YOLO_OFFLINE",
            "TORCH_EXTENSIONS_DIR", "GSDISTILL_SHARED_DATA")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    done = subprocess.run(["bash", "tools/gpu_check.sh", "--cpu", "--steps", "8", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=900, env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = (tmp_path / "gpu_check.md").read_text()
    rows = {(cells := _cells(line))[0]: cells for line in report.splitlines()
            if line.startswith("| ") and "---" not in line}
    for name in ("torch bf16, 1 process", "deepspeed bf16 (zero2_optimizer_offload.json), 1 process"):
        exit_code, first_s, step_s, pages_s, data_ms, mem, _, _ = rows[name][1:]
        assert exit_code == "0" and float(first_s) > 0 and float(step_s) > 0 and float(pages_s) > 0 and float(mem) > 0
        assert 0 <= float(data_ms) < 1e3 * float(step_s)
    for name in ("torch bf16 on cpu", "deepspeed bf16 on cpu"):
        exit_code, *diffs = rows[name][1:]
        assert exit_code == "0" and len(diffs) == 3
        assert all(float(d) < 0.05 for d in diffs), (name, diffs)  # bf16 stays near the CPU fp32 run
    assert "Detection, head only, 1 epoch (8 pages, 64 px): exit 0." in report
    assert re.search(r"Profile \(torch engine, bf16, 3 steps\): [\d.]+ ms device time per step; top kernels: `", report)
    # the loop itself profiled (train.profile_steps=3 on the torch run): its data fetch is one of the rows
    assert "Loop profile of the torch run (run0/profile/top_ops.txt; `trace.json` beside it): 3 profiled steps" in report
    assert re.search(r"CPU: \d+ cores for this process; cgroup quota (none|not readable|[\d.]+ CPUs)", report)
    for phase in ("gsdistill.data", "gsdistill.sync", "gsdistill.backward"):
        assert re.search(rf"\n\s+[\d.]+\s+1\.0  {phase}\n", report), phase
    wanted = ("data: synthetic pages, built and embedded", "agreement: CPU fp32 reference", "all")
    parts = {name: float(cells[1]) for name, cells in rows.items() if name in wanted}
    assert len(parts) == 3 and all(s > 0 for s in parts.values())
    assert "tests marked cuda" not in rows  # a GPU-only part


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable GPU")
def test_gpu_check_without_a_gpu_says_to_use_cpu(tmp_path):
    done = subprocess.run(["bash", "tools/gpu_check.sh", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "--cpu" in done.stderr.strip().splitlines()[-1]
