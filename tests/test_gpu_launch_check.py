"""``tools/gpu_check.sh --cpu`` runs end to end at tiny sizes (as CI keeps it working): both engines
in bf16, the CPU fp32 reference, one epoch of head-only detection, and the markdown table."""
from __future__ import annotations

import os
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
    done = subprocess.run(["bash", "tools/gpu_check.sh", "--cpu", "--steps", "3", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=900, env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    table = (tmp_path / "gpu_check.md").read_text().splitlines()
    rows = {(cells := _cells(line))[0]: cells for line in table if line.startswith("| ") and "---" not in line}
    for name in ("torch bf16, 1 process", "deepspeed bf16, 1 process"):
        exit_code, step_s, images_s, mem, _, _, diff = rows[name][1:]
        assert exit_code == "0" and float(step_s) > 0 and float(images_s) > 0 and float(mem) > 0
        assert float(diff) < 0.05, (name, diff)  # bf16 after 3 steps stays near the CPU fp32 run
    detection = next(cells for name, cells in rows.items() if name.startswith("detection"))
    assert detection[1] == "0"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable GPU")
def test_gpu_check_without_a_gpu_says_to_use_cpu(tmp_path):
    done = subprocess.run(["bash", "tools/gpu_check.sh", "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "--cpu" in done.stderr.strip().splitlines()[-1]
