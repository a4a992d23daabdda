"""Issue 55 for pretraining: a run folder is one run's (refused, --overwrite, locked), a resume is the
same run (keys, data, history.jsonl), every checkpoint part is checked before it is loaded, a signal
logs its step and a second one is quiet, a NaN backbone is never exported."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

from gsdistill.cli import main
from gsdistill.config import load_config
from gsdistill.errors import InputError, TrainingInterrupted
from gsdistill.output_folder import OutputConflict
from gsdistill.pretrain import checkpoint
from gsdistill.pretrain.data_stream import FixedBatches, tensor_batch
from gsdistill.pretrain.metrics_log import read_metrics
from gsdistill.pretrain.run import resume_config, run_pretraining
from gsdistill.run_history import read as read_history

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "optim.batch_size=4", "optim.steps=4", "optim.warmup_steps=1", "train.log_every=1",
        "train.progress=false", "train.tensorboard=false", "train.plots=false", "threads=1"]


def tiny(*extra):
    return load_config("pretrain", None, TINY + list(extra))


def fixed(cfg, n=2):
    batches = [tensor_batch(cfg, 4, seed=s) for s in range(n)]
    return lambda rank, world: FixedBatches(batches, rank, world)


def train(run_dir, *extra, **kw):
    cfg = tiny(*extra)
    return run_pretraining(cfg, run_dir, fixed(cfg), **kw)


def snapshot(folder) -> dict:
    """Every file below ``folder`` (but the lock) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".gsdistill.lock"}


def steps_logged(run_dir):
    return [int(r["step"]) for r in read_metrics(run_dir / "metrics.csv")]


def run_python(code: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, timeout=300)


# ---- 1. a folder holding a run is refused, --overwrite removes only a run's files -----------------
def test_a_folder_holding_a_run_is_refused_and_left_as_it_was(tmp_path):
    run = train(tmp_path / "run", "optim.steps=2")
    before = snapshot(run)
    with pytest.raises(OutputConflict):
        train(run, "optim.steps=3")
    assert main(["pretrain", "--run-dir", str(run), *TINY]) == 2
    assert snapshot(run) == before
    (tmp_path / "made").mkdir()  # an existing empty folder is fine
    assert steps_logged(train(tmp_path / "made")) == [1, 2, 3, 4]


def test_overwrite_replaces_the_run_and_keeps_the_users_files(tmp_path):
    run = train(tmp_path / "run", "optim.steps=2", "train.ckpt_every=1")
    (run / "notes.txt").write_text("mine")
    train(run, "optim.steps=1", overwrite=True)
    assert (run / "notes.txt").read_text() == "mine"
    assert steps_logged(run) == [1]
    assert [p.name for p in checkpoint.checkpoints_in(run / "checkpoints")] == ["step-000001"]
    start = read_history(run)[0]
    assert start["event"] == "start" and "checkpoints" in start["replaced"]
    # a folder with a name a run writes (data/) but no run in it may be the user's: never removed
    (tmp_path / "own" / "data").mkdir(parents=True)
    (tmp_path / "own" / "data" / "x.csv").write_text("1")
    with pytest.raises(OutputConflict):
        train(tmp_path / "own", overwrite=True)
    assert (tmp_path / "own" / "data" / "x.csv").read_text() == "1"


# ---- 2. one writer per folder ----------------------------------------------------------------------
HOLD = """
    import sys, time
    from gsdistill.output_folder import lock_folder
    with lock_folder(sys.argv[1]):
        print("held", flush=True)
        time.sleep(120)
"""


@pytest.fixture
def held(tmp_path):
    """``hold(folder) -> pid`` of another live process holding ``folder``."""
    procs = []

    def hold(folder):
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLD), str(folder)],
                                      stdout=subprocess.PIPE, text=True))
        assert procs[-1].stdout.readline().strip() == "held"
        return procs[-1].pid
    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_second_writer_is_refused_naming_the_holder(tmp_path, held, capsys):
    run = train(tmp_path / "run", "optim.steps=1")
    before = snapshot(run)
    pid = held(run)
    assert main(["pretrain", f"train.resume={run}", "optim.steps=2"]) == 2
    assert str(pid) in capsys.readouterr().err
    assert snapshot(run) == before
    out = tmp_path / "out"
    out.mkdir()
    pid = held(out)
    assert main(["export", str(run), str(out)]) == 2
    assert str(pid) in capsys.readouterr().err and snapshot(out) == {}


class LockProbe(FixedBatches):
    """Records at every batch whether the run folder is locked (a new open of the lock cannot take it)."""

    def __next__(self):
        import fcntl
        with open(self.run_dir / ".gsdistill.lock") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.seen.append(False)
            except BlockingIOError:
                self.seen.append(True)
        return super().__next__()


def test_the_run_holds_its_folder_while_it_trains(tmp_path):
    cfg, probe = tiny("optim.steps=2"), LockProbe([tensor_batch(tiny(), 4, seed=0)])
    probe.run_dir, probe.seen = tmp_path / "run", []
    run_pretraining(cfg, probe.run_dir, lambda r, w: probe)
    assert probe.seen == [True, True] and not (probe.run_dir / ".gsdistill.lock").exists()


# ---- 3. a resume is the same run ----------------------------------------------------------------
def test_a_resume_changing_what_a_step_is_is_refused_unless_allowed(tmp_path):
    run = train(tmp_path / "run", "train.stop_after=2")
    before = snapshot(run)
    with pytest.raises(InputError):
        train(None, f"train.resume={run}", "train.seed=5")
    assert snapshot(run) == before
    train(None, f"train.resume={run}", "train.seed=5", "train.resume_changes=allow", "train.stop_after=3")
    cfg, _, _ = resume_config(None, [f"train.resume={run}", "optim.steps=5"])  # the schedule may grow
    run_pretraining(cfg, None, fixed(cfg))
    assert steps_logged(run) == [1, 2, 3, 4, 5]
    events = [(h["event"], h["step"], h.get("changed")) for h in read_history(run) if h["event"] != "stop"]
    assert events == [("start", 0, None), ("resume", 2, {"train.seed": [0, 5]}),
                      ("resume", 3, {"optim.steps": [4, 5]})]


def test_a_resume_reads_the_runs_own_data_from_any_folder(tmp_path, monkeypatch):
    from gsdistill.pretrain.run import prepare_synthetic
    data = ["data.synthetic_pages=8", "data.page_width=256", "data.page_height=320", "data.shuffle_buffer=0"]
    prepare_synthetic(tiny(*data), tmp_path / "shards")
    monkeypatch.chdir(tmp_path)
    run = run_pretraining(tiny(*data, "data.shards=shards", "train.stop_after=1"), tmp_path / "run")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # "shards" does not exist here
    run_pretraining(resume_config(None, [f"train.resume={run}", "train.stop_after=2"])[0])
    assert steps_logged(run) == [1, 2]
    assert {h["data"]["folder"] for h in read_history(run) if h["event"] != "stop"} == {str(tmp_path / "shards")}
    manifest = tmp_path / "shards" / "manifest.json"
    manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), created="rebuilt")))
    before = snapshot(run)
    with pytest.raises(InputError):
        run_pretraining(resume_config(None, [f"train.resume={run}"])[0])
    assert snapshot(run) == before


# ---- 4. every part of a checkpoint is checked before it is loaded ---------------------------------
RESUME = """
    import sys
    from gsdistill.config import load_config
    from gsdistill.errors import GsdistillError
    from gsdistill.pretrain.data_stream import FixedBatches, tensor_batch
    from gsdistill.pretrain.run import run_pretraining
    cfg = load_config("pretrain", None, sys.argv[2:] + [f"train.resume={sys.argv[1]}", "optim.steps=4"])
    try:
        run_pretraining(cfg, None, lambda r, w: FixedBatches([tensor_batch(cfg, 4, seed=0)], r, w))
    except GsdistillError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
"""


@pytest.fixture(scope="module")
def other_runs(tmp_path_factory):
    """Checkpoints at step 2 of runs of another width and another depth (their optimizer.pt)."""
    root = tmp_path_factory.mktemp("other_runs")
    wide = train(root / "wide", "optim.steps=2", "model.backbone.embed_dim=96", "model.backbone.num_heads=3")
    deep = train(root / "deep", "optim.steps=2", "model.backbone.depth=2")
    return {name: run / "checkpoints" / "step-000002" for name, run in (("wide", wide), ("deep", deep))}


@pytest.mark.parametrize("part", ["optimizer of another width", "optimizer of another depth", "rng", "step"])
def test_a_checkpoint_part_that_does_not_belong_is_refused_naming_it(tmp_path, other_runs, part):
    run = train(tmp_path / "run", "optim.steps=2")
    ckpt = run / "checkpoints" / "step-000002"
    if part.startswith("optimizer"):
        bad = ckpt / "optimizer.pt"
        shutil.copy(other_runs["wide" if "width" in part else "deep"] / "optimizer.pt", bad)
    elif part == "rng":
        bad = ckpt / "rng-rank0.pt"
        torch.save({"torch": torch.zeros(3)}, bad)
    else:
        bad = ckpt / "state.json"
        bad.write_text(json.dumps(dict(json.loads(bad.read_text()), step=1)))
    before = snapshot(run)
    # in a process of its own: the fused AdamW crashed the process on a foreign optimizer state
    done = run_python(RESUME, run, *TINY)
    assert done.returncode == 2, done.stderr[-2000:]
    assert str(bad) in done.stderr and "Traceback" not in done.stderr
    assert snapshot(run) == before


# ---- 5. a file where a folder is expected ---------------------------------------------------------
def test_a_file_given_as_a_folder_is_refused(tmp_path):
    run = train(tmp_path / "run", "optim.steps=1")
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert main(["pretrain", "--run-dir", str(afile), *TINY]) == 2
    assert main(["export", str(run), str(afile)]) == 2
    assert afile.read_text() == "keep"
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    before = snapshot(tmp_path / "out")
    assert main(["export", str(run), str(tmp_path / "out"), "--weights", "teacher"]) == 2  # holds a backbone
    assert snapshot(tmp_path / "out") == before
    assert main(["export", str(run), str(tmp_path / "out"), "--weights", "teacher", "--overwrite"]) == 0
    assert snapshot(tmp_path / "out") != before


# ---- 6. a signal stops with the step's row; a second one is quiet ---------------------------------
class SignalAtBatch(FixedBatches):
    def __next__(self):
        batch = super().__next__()
        if self.position["batch"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return batch


def test_a_signal_logs_the_row_of_the_step_it_checkpoints(tmp_path):
    cfg = tiny("optim.steps=6", "train.log_every=100")
    with pytest.raises(TrainingInterrupted):
        run_pretraining(cfg, tmp_path, lambda r, w: SignalAtBatch([tensor_batch(cfg, 4, seed=0)], r, w))
    assert checkpoint.read_state(checkpoint.resolve_checkpoint(tmp_path))["step"] == 3
    assert steps_logged(tmp_path) == [3] and read_history(tmp_path)[-1]["reason"] == "signal"


AGAIN = """
    import os, signal, sys
    from gsdistill import run_history
    from gsdistill.config import load_config
    from gsdistill.errors import run_training_command
    from gsdistill.pretrain import checkpoint
    from gsdistill.pretrain.data_stream import FixedBatches, tensor_batch
    from gsdistill.pretrain.run import run_pretraining
    from gsdistill.run_log import RunLog

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)

    class Stream(FixedBatches):
        def __next__(self):
            batch = super().__next__()
            if self.position["batch"] == 2:
                ctrl_c()
            return batch
    finalize, close, record = checkpoint.finalize, RunLog.close, run_history.record
    # Ctrl-C again while the checkpoint is written, while the log closes, and after the loop has stopped
    checkpoint.finalize = lambda *a, **k: (ctrl_c(), finalize(*a, **k))[1]
    RunLog.close = lambda self: (ctrl_c(), close(self))[1]
    run_history.record = lambda *a, **k: (record(*a, **k), ctrl_c() if a[1] == "stop" else None)[0]
    cfg = load_config("pretrain", None, sys.argv[2:] + ["optim.steps=6", "train.progress=true"])
    sys.exit(run_training_command("x", lambda: run_pretraining(
        cfg, sys.argv[1], lambda r, w: Stream([tensor_batch(cfg, 4, seed=0)], r, w))))
"""


def test_a_second_ctrl_c_is_quiet_and_the_checkpoint_whole(tmp_path):
    done = run_python(AGAIN, tmp_path / "run", *TINY)
    assert done.returncode == 130, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-2000:]
    ckpt = checkpoint.resolve_checkpoint(tmp_path / "run")
    checkpoint.verify(ckpt)  # whole
    assert checkpoint.read_state(ckpt)["step"] == 2 and steps_logged(tmp_path / "run")[-1] == 2
    assert not list((tmp_path / "run" / "checkpoints").glob(".tmp-*"))


# ---- 7. a NaN backbone is never exported ---------------------------------------------------------
@pytest.mark.parametrize("weights", ["student", "teacher"])
def test_a_backbone_with_nan_weights_is_not_exported(tmp_path, weights):
    run = train(tmp_path / "run", "optim.steps=1")
    path = checkpoint.resolve_checkpoint(run) / checkpoint.MODEL_FILE
    state = load_file(str(path))
    state[f"{'teacher.' if weights == 'teacher' else ''}backbone.pos_embed"][0, 0, 0] = float("nan")
    save_file(state, str(path))
    assert main(["export", str(run), str(tmp_path / "out"), "--weights", weights]) == 2
    assert not (tmp_path / "out").exists()
