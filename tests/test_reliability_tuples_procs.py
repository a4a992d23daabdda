"""``gsdistill tuples`` as a real process (issue 33): killing its main process ends its pool
workers (building and embedding), and a full disk is one line naming the file, exit code 2, after which the same command
resumes to the output of a straight build."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from test_build_parallel import output_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, Linux rlimits")
ENV = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")


def build_command(out, pages: int, workers: int) -> list[str]:
    return [sys.executable, "-m", "gsdistill.cli", "tuples", "build", "--from", "synthetic", str(pages), "--out",
            str(out), "--pages-per-shard", "1", "--workers", str(workers), "build.progress=false"]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, ...); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def children(pid: int) -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir()
            if d.name.isdigit() and (s := _stat(int(d.name))) is not None and int(s[1]) == pid]


def running(pid: int) -> bool:
    s = _stat(pid)
    return s is not None and s[0] not in ("Z", "X")  # a zombie has ended; its new parent reaps it


@contextmanager
def own_session(command: list[str], **popen):
    """The command in a session of its own, every process of which is killed at the end (also when
    the test failed), so no test leaves a process behind."""
    proc = subprocess.Popen(command, env=ENV, stderr=subprocess.DEVNULL, start_new_session=True, **popen)
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_main_and_wait(proc, workers: list[int], sig=signal.SIGKILL) -> list[int]:
    """Kill the main process only (``kill PID``, not its group); the workers still running 5 s later."""
    os.kill(proc.pid, sig)
    proc.wait(timeout=10)
    deadline = time.time() + 5
    while any(map(running, workers)) and time.time() < deadline:
        time.sleep(0.1)
    return [pid for pid in workers if running(pid)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_the_main_process_ends_its_pool_workers(tmp_path, sig):
    with own_session(build_command(tmp_path / "out", 400, workers=2), stdout=subprocess.DEVNULL) as proc:
        deadline = time.time() + 60
        while len(workers := children(proc.pid)) < 2:
            assert proc.poll() is None and time.time() < deadline, "the build never started its 2 workers"
            time.sleep(0.05)
        time.sleep(0.5)  # workers busy building a unit, not just started
        assert kill_main_and_wait(proc, workers, sig) == [], "pool workers outlived the killed build"


class SlowEncoder:
    """An encoder busy for a minute on every piece (a worker in the middle of a long piece)."""
    dim = 4

    def __init__(self, name=None, device="cpu", precision="fp32"):
        pass

    def encode(self, texts, batch_size=64):
        time.sleep(60)


def test_killing_the_embedding_process_ends_its_busy_encoder_workers(tmp_path):
    script = ("import sys; sys.path.insert(0, sys.argv[1])\n"
              "from gsdistill.tuples.embedding.encoder_pool import EncoderPool\n"
              "from test_reliability_tuples_procs import SlowEncoder\n"
              "with EncoderPool(SlowEncoder, 'slow', 'cpu', workers=2, batch_size=1) as pool:\n"
              "    print(pool.dim, flush=True)\n"
              "    pool.encode(list('abcdefgh'))  # two pieces of 4 texts: both workers busy\n")
    with own_session([sys.executable, "-c", script, str(Path(__file__).parent)], text=True,
                     stdout=subprocess.PIPE) as proc:
        assert proc.stdout.readline().strip() == "4", "the pool did not start"
        workers = [pid for pid in children(proc.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(workers) == 2
        time.sleep(1)  # both in the middle of a piece
        assert kill_main_and_wait(proc, workers) == [], "encoder workers outlived the killed process"


def test_full_disk_is_one_line_and_the_same_command_resumes(tmp_path):
    straight = tmp_path / "straight"
    subprocess.run(build_command(straight, 8, workers=1), env=ENV, check=True, capture_output=True, timeout=300)
    sizes = [p.stat().st_size for p in sorted(straight.glob("shard-*.tar"))]
    # room for the shards before the first larger one: those are kept, that one hits the limit
    first_larger = next((i for i, s in enumerate(sizes) if s > max(sizes[:i] or [s])), None)
    assert first_larger is not None, f"shard sizes {sizes}: none larger than the shards before it"
    limit = max(sizes[:first_larger])

    def file_size_limit():  # as `ulimit -f`: a write past it fails with EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    out = tmp_path / "out"
    full = subprocess.run(build_command(out, 8, workers=1), env=ENV, capture_output=True, text=True, timeout=300,
                          preexec_fn=file_size_limit)
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr
    assert full.stderr.strip() == (f"gsdistill tuples build: error: {out / f'shard-{first_larger:06d}.tar'}: cannot "
                                   "write (File too large); free some space (or raise the file size limit) and run "
                                   "the same command again")
    resumed = subprocess.run(build_command(out, 8, workers=1), env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{first_larger} of 8 shards kept (verified)" in resumed.stderr
    assert output_of(out) == output_of(straight)
