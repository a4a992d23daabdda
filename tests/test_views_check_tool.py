"""``tools/gpu/views_check.py`` (issue 56's GPU check, one call on a lent machine) rehearsed on the CPU: the
data, the bare engine step, both loop runs and the render each report their numbers and every target of
the issue gets a verdict, so the lease is not spent finding a typo."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_views_check_rehearses_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu" / "views_check.py"), "--device", "cpu",
                          "--out", str(out), "--pages", "24", "--batch", "4", "--workers", "1", "--steps", "8",
                          "--warmup", "3", "--bare-steps", "4", "--bare-warmup", "1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    report = (out / "views_check.md").read_text()
    assert re.search(r"bare engine step .*: median [\d.]+ ms", report)
    for name in ("batched", "cpu"):  # both loop runs timed 5 steps each (8, the first 3 untimed)
        assert re.search(rf"^\| {name} \| 5 \| [\d.]+ \| [\d.]+ \|", report, re.M), report
    for target in ("median step <= 1.05x bare", "p90 <= 1.2x bare", "median data wait <= 2 ms",
                   "no step above 3x the median"):
        assert re.search(rf"^\| {re.escape(target)} \| [\d.]+ ?(x|ms) \| \*\*(met|missed)\*\* \|$", report, re.M), target
    assert re.search(r"eager +[\d.]+ ms a batch", report)
