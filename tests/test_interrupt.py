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

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES, PER_SHARD = 60, 20  # units of 20 large pages: seconds of work left when the first shard appears


def _build(out: Path, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "gsdistill.cli", "tuples", "build", "--from", "synthetic", str(PAGES), "--out",
           str(out), "--workers", "2", "--pages-per-shard", str(PER_SHARD), "build.progress=false",
           "synthetic.width=1200", "synthetic.height=1500"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _group_size(pgid: int) -> int:
    """Processes in process group ``pgid`` (Linux: /proc/PID/stat, field 5)."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        count += int(fields[2]) == pgid
    return count


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
        time.sleep(0.2)  # the second press while the units in progress still run (on idle cores 6 pages ended in 0.5 s)
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


@pytest.mark.slow  # a build, two encoder processes importing torch, then the whole encoding: ~2 minutes
def test_second_ctrl_c_ends_a_text_encoding_with_workers(tmp_path):
    shards = tmp_path / "shards"
    assert _build(shards).wait(timeout=300) == 0
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    embed = [sys.executable, "-m", "gsdistill.cli", "tuples", "embed", str(shards), "--workers", "2", "--force"]
    proc = subprocess.Popen(embed, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while _group_size(proc.pid) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)  # the two encoder processes started (they may still be importing torch)
        assert proc.poll() is None, "the encoding ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert _group_gone(proc.pid, 15), "encoder processes outlived the command"
    again = subprocess.run(embed[:-1], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
