"""Output folders: refused when they are (inside, around) an input or another output; one writer at a time."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from gsdistill.output_folder import (LOCK_NAME, FolderBusy, OutputConflict, check_output_dir, holder,
                                     lock_folder)


def test_output_equal_to_inside_or_around_an_input_is_refused(tmp_path):
    src = tmp_path / "shards"
    src.mkdir()
    (src / "shard-000000.tar").write_bytes(b"x")
    for out in (src, src / "sub", tmp_path):
        with pytest.raises(OutputConflict):
            check_output_dir(out, "--out", inputs=[("shard folder", src)])
    assert (src / "shard-000000.tar").read_bytes() == b"x"
    assert check_output_dir(tmp_path / "new", "--out", inputs=[("shard folder", src)]) == tmp_path / "new"


def test_output_given_twice_or_nested_in_another_output_is_refused(tmp_path):
    with pytest.raises(OutputConflict):
        check_output_dir(tmp_path / "x", "--train-out", outputs=[("--eval-out", tmp_path / "x")])
    with pytest.raises(OutputConflict):
        check_output_dir(tmp_path / "x" / "y", "--train-out", outputs=[("--eval-out", tmp_path / "x")])
    check_output_dir(tmp_path / "x", "--train-out", outputs=[("--eval-out", tmp_path / "y")])


def test_output_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("keep")
    for out in (f, f / "below"):
        with pytest.raises(OutputConflict):
            check_output_dir(out, "--out")
    assert f.read_text() == "keep"


def test_symlinked_output_onto_the_input_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "alias").symlink_to(src)
    with pytest.raises(OutputConflict):
        check_output_dir(tmp_path / "alias", "--out", inputs=[("input", src)])


def test_lock_is_released_and_reentrant(tmp_path):
    with lock_folder(tmp_path / "run"):
        with lock_folder(tmp_path / "run"):  # a stage calling another on the same folder
            assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert (tmp_path / "run" / LOCK_NAME).exists()
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    assert holder(tmp_path / "run") is None


HOLD = textwrap.dedent("""
    import sys, time
    from gsdistill.output_folder import lock_folder
    with lock_folder(sys.argv[1]):
        print("held", flush=True)
        time.sleep(60)
""")


def test_second_writer_is_refused_with_the_holders_pid_and_a_dead_holder_is_taken_over(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusy, match=f"PID {proc.pid}"):
            with lock_folder(run):
                pass
        assert holder(run)["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait()
    # killed: the lock file is still there, but the kernel dropped its lock
    assert (run / LOCK_NAME).exists()
    with lock_folder(run):
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_pid_fallback_takes_over_a_dead_pid_and_refuses_a_live_one(tmp_path, monkeypatch):
    import gsdistill.output_folder as of

    def no_flock(folder, path):
        return of._acquire_by_pid(folder, path)
    monkeypatch.setattr(of, "_acquire", no_flock)
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": of.socket.gethostname()}))
    with lock_folder(run):
        pass
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (run / LOCK_NAME).write_text(json.dumps({"pid": live.pid, "host": of.socket.gethostname()}))
        with pytest.raises(FolderBusy, match=str(live.pid)):
            with lock_folder(run):
                pass
    finally:
        live.kill()
        live.wait()
