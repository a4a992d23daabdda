"""Issue 63 item 7: a full disk (here the file size limit, ``ulimit -f``, set in a child process; Python
ignores SIGXFSZ, so a write past the limit fails with EFBIG as on a full disk) while writing a checkpoint,
an export or a retriever model is one line naming the file and the free space, exit 2, no traceback;
what was there stays byte-identical, an export leaves no empty folder, and a retriever run leaves no model
folder without weights."""
from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from retriever_fixtures import tiny_beir, tiny_encoder  # noqa: F401  (fixtures)

from gsdistill.cli import main
from gsdistill.config import load_config
from gsdistill.errors import OutputWriteError
from gsdistill.pretrain.data_stream import FixedBatches, tensor_batch
from gsdistill.pretrain.run import run_pretraining

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "optim.batch_size=4", "optim.steps=4", "optim.warmup_steps=1", "train.log_every=1",
        "train.progress=false", "train.tensorboard=false", "train.plots=false", "threads=1",
        "data.synthetic_pages=8", "data.page_width=256", "data.page_height=320"]


def gsdistill(*args, limit: int | None = None) -> subprocess.CompletedProcess:
    """``gsdistill ARGS`` in a child whose files may not grow past ``limit`` bytes."""
    def cap():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "gsdistill.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600, preexec_fn=cap)


def files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".gsdistill.lock"}


def one_line_no_room(r: subprocess.CompletedProcess, path: Path) -> str:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert f"{path}: cannot write (File too large)" in line and "free on its disk" in line, r.stderr
    return line


@pytest.mark.slow  # five pretraining / export processes: ~3 minutes on two busy cores
def test_checkpoint_and_export_on_a_full_disk(tmp_path):
    run = tmp_path / "run"
    assert gsdistill("pretrain", *TINY, "train.stop_after=1", "--run-dir", run).returncode == 0
    first = run / "checkpoints" / "step-000001"
    weights = (first / "model.safetensors").stat().st_size
    limit = weights // 2  # every other file the run writes is smaller
    before = files(run / "checkpoints")

    r = gsdistill("pretrain", f"train.resume={run}", "train.stop_after=2", limit=limit)
    one_line_no_room(r, run / "checkpoints" / ".tmp-step-000002" / "model.safetensors")
    assert files(run / "checkpoints") == before  # the checkpoint before: intact, still the latest
    assert not list((run / "checkpoints").glob(".tmp-*"))  # no half-made checkpoint left
    assert gsdistill("pretrain", f"train.resume={run}", "train.stop_after=2").returncode == 0  # room again: resumes

    out = tmp_path / "exported"
    r = gsdistill("export", run, out, limit=1 << 16)
    one_line_no_room(r, out / "backbone.safetensors")
    assert not out.exists()  # no empty folder left

    assert gsdistill("export", run, out).returncode == 0
    exported = files(out)
    r = gsdistill("export", run, out, "--overwrite", "--weights", "teacher", limit=1 << 16)
    one_line_no_room(r, out / "backbone.safetensors")
    assert files(out) == exported  # the backbone there before: byte-identical, no .tmp beside it


@pytest.mark.slow  # two retriever trainings in child processes: ~1 minute
def test_retriever_model_on_a_full_disk_leaves_no_model_folder(tiny_beir, tiny_encoder, tmp_path):  # noqa: F811
    run = tmp_path / "runs" / "r"
    args = ["retriever", "train", f"data.path={tiny_beir}", f"model.encoder={tiny_encoder}", f"run.dir={run.parent}",
            "run.name=r", "model.query_max_length=16", "model.passage_max_length=32", "train.batch_size=1",
            "train.epochs=1", "eval.k=20", "data.folds=2", "threads=1", "train.device=cpu"]
    weights = (Path(tiny_encoder) / "model.safetensors").stat().st_size
    r = gsdistill(*args, limit=weights // 2)
    one_line_no_room(r, run / "model" / "model.safetensors")
    assert not (run / "model").exists() and not list(run.glob(".model.*"))  # no model folder without weights
    r = gsdistill(*args, "--overwrite")  # room again: the run folder holds that run's metrics, not a model
    assert r.returncode == 0, r.stderr
    assert (run / "model" / "model.safetensors").is_file()


def _full_disk(*args, **kw):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_checkpoint_on_a_full_disk_keeps_the_one_before(tmp_path, monkeypatch):
    cfg = load_config("pretrain", None, TINY + ["train.ckpt_every=1", "train.keep_checkpoints=0"])
    batches = [tensor_batch(cfg, 4, seed=s) for s in range(2)]
    run = run_pretraining(cfg, tmp_path / "run", lambda r, w: FixedBatches(batches, r, w),)
    before = files(run / "checkpoints")
    from gsdistill.pretrain import checkpoint
    monkeypatch.setattr(checkpoint, "save_file", _full_disk)
    cfg = load_config("pretrain", None, TINY + ["train.ckpt_every=1", "optim.steps=6", f"train.resume={run}"])
    with pytest.raises(OutputWriteError) as e:
        run_pretraining(cfg, None, lambda r, w: FixedBatches(batches, r, w))
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{run / 'checkpoints' / '.tmp-step-000005' / 'model.safetensors'}: cannot write "
                              "(No space left on device): ") and "free on its disk" in message
    assert files(run / "checkpoints") == before and not list((run / "checkpoints").glob(".tmp-*"))


def test_an_export_on_a_full_disk_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch, capsys):
    cfg = load_config("pretrain", None, TINY)
    batches = [tensor_batch(cfg, 4, seed=0)]
    run = run_pretraining(cfg, tmp_path / "run", lambda r, w: FixedBatches(batches, r, w))
    from gsdistill.models import backbone
    monkeypatch.setattr(backbone, "save_file", _full_disk)
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{tmp_path / 'out' / 'backbone.safetensors'}: cannot write (No space left" in err
    assert not (tmp_path / "out").exists()


def test_a_retriever_model_saved_again_on_a_full_disk_keeps_the_one_before(tiny_encoder, tmp_path,  # noqa: F811
                                                                           monkeypatch):
    from gsdistill.retriever import st_format
    from gsdistill.retriever.model import DualEncoder
    model = DualEncoder(tiny_encoder, query_max_length=16, passage_max_length=32)
    out = model.save_pretrained(tmp_path / "model")
    before = files(out)

    def weights_then_full(folder, *a, **kw):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(st_format, "write_sentence_transformer", weights_then_full)
    with pytest.raises(OutputWriteError, match=rf"^{out / 'model.safetensors'}: cannot write \(No space left on "
                                               r"device\): .* free on its disk"):
        model.save_pretrained(out)
    assert files(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
