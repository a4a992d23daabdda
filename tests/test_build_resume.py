"""A build killed mid-way (SIGKILL) and started again with the same command keeps its finished shards,
rebuilds only what is missing or damaged, and ends with exactly the output of a straight build."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from gsdistill.tuples.builder.driver import build_shards
from test_build_parallel import cfg, output_of

SETTINGS = ["build.pages_per_shard=3", "synthetic.width=300", "synthetic.height=400", "build.progress=false"]


def build_command(out, workers=1):
    return [sys.executable, "-m", "gsdistill.cli", "tuples", "build", "--from", "synthetic", "60", "--out", str(out),
            "--workers", str(workers), *SETTINGS]


def test_killed_build_resumes_to_the_straight_output(tmp_path):
    out = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    # two worker processes, all killed at once with the parent (its own process group): a machine going down
    proc = subprocess.Popen(build_command(out, workers=2), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while len(list((out / "units").glob("unit-*.json"))) < 4 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")
            if (out / "units" / p.name.replace("shard", "unit").replace(".tar", ".json")).exists()}
    assert 4 <= len(kept) < 20 and not (out / "manifest.json").exists()
    resumed = subprocess.run(build_command(out), env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(kept)} of 20 shards kept (verified)" in resumed.stderr
    assert all(out.joinpath(name).stat().st_mtime_ns == t for name, t in kept.items())  # not rebuilt
    build_shards("synthetic", "60", tmp_path / "straight", cfg(*SETTINGS, "build.workers=2"))
    assert output_of(out) == output_of(tmp_path / "straight")
    assert not list(out.rglob("*.tmp"))


def test_damaged_shards_and_records_are_rebuilt_and_nothing_else(tmp_path, caplog):
    out = tmp_path / "out"
    build_shards("synthetic", "15", out, cfg(*SETTINGS))
    straight = output_of(out)
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")}
    shard1 = out / "shard-000001.tar"
    shard1.write_bytes(shard1.read_bytes()[:1000])                # cut short
    shard2 = out / "shard-000002.tar"
    data = bytearray(shard2.read_bytes())
    data[700] ^= 0xFF                                              # same size, one byte changed
    shard2.write_bytes(bytes(data))
    (out / "units" / "unit-000003.json").unlink()                 # finished shard without its record
    from gsdistill.output_folder import lock_folder
    with lock_folder(out):  # a write of a build that was killed (recorded as gsdistill's, as the build's is)
        (out / "shard-000004.tar.123.tmp").write_bytes(b"partial")
    build_shards("synthetic", "15", out, cfg(*SETTINGS))
    assert "2 of 5 shards kept (verified), 3 to build" in caplog.text
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")}
    assert [n for n in sorted(after) if after[n] != before[n]] == ["shard-000001.tar", "shard-000002.tar",
                                                                    "shard-000003.tar"]
    assert output_of(out) == straight and not list(out.glob("*.tmp"))


def test_a_changed_setting_starts_the_folder_over(tmp_path):
    out = tmp_path / "out"
    build_shards("synthetic", "9", out, cfg(*SETTINGS))
    first = output_of(out)
    build_shards("synthetic", "9", out, cfg(*SETTINGS, "synthetic.seed=5"))
    build_shards("synthetic", "9", tmp_path / "fresh", cfg(*SETTINGS, "synthetic.seed=5"))
    assert output_of(out) == output_of(tmp_path / "fresh") != first
