"""Issue 63 item 6: Ctrl-C pressed twice (as a terminal sends it: SIGINT to every process of the
command) ends a command with a worker pool: the workers are killed, the command exits 130 with one line
and no traceback, the shard cut off is left as a ``.tmp`` file, and the same command run again discards
it and completes. Run for real, in a process group of its own."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES, PER_SHARD = 60, 6


def _build(out: Path, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gsdistill.cli", "tuples", "build", "--from", "synthetic", str(PAGES), "--out",
           str(out), "--workers", "2", "--pages-per-shard", str(PER_SHARD), "build.progress=false",
           "synthetic.width=1200", "synthetic.height=1500"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _group_gone(pgid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_second_ctrl_c_ends_a_parallel_build_and_the_rerun_completes(tmp_path):
    out = tmp_path / "shards"
    proc = _build(out, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("shard-*.tmp")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)  # the workers are writing shards
        assert proc.poll() is None, "the build ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # generous: it ends at once; a hang fails here
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert "press Ctrl-C again to stop at once" in err and "worker processes killed" in err, err
    assert _group_gone(proc.pid, 15), "worker processes outlived the command"
    assert not (out / "manifest.json").exists()  # not complete, and not said to be

    again = _build(out)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["pages"] == PAGES
    assert not list(out.rglob("*.tmp"))  # the cut-off shard discarded
