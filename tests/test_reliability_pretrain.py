"""Pretraining faults a user meets first (issue 12): no masked view, a reused run folder, resume
without the original overrides, damaged checkpoints, divergence and NaN data."""
from __future__ import annotations

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.errors import CorruptFileError, InputError
from gsdistill.losses import IBOTPatchLoss, sinkhorn_knopp
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain import checkpoint
from gsdistill.pretrain.data_stream import FixedBatches, tensor_batch
from gsdistill.pretrain.loop import NonFiniteBatch, TrainingDiverged
from gsdistill.pretrain.metrics_log import read_metrics
from gsdistill.pretrain.run import resume_config, run_pretraining

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "optim.batch_size=4", "optim.steps=4", "optim.warmup_steps=1", "train.log_every=1",
        "train.progress=false", "train.tensorboard=false", "train.plots=false"]


def tiny(*extra):
    return load_config("pretrain", None, TINY + list(extra))


def fixed(cfg, n=3):
    batches = [tensor_batch(cfg, 4, seed=s) for s in range(n)]
    return lambda rank, world: FixedBatches(batches, rank, world)


def steps_logged(run_dir):
    return [int(r["step"]) for r in read_metrics(run_dir / "metrics.csv")]


# ---- 1. no masked view ---------------------------------------------------------------------------
@pytest.mark.parametrize("centering", ["sinkhorn_knopp", "softmax"])
def test_batch_without_masked_view_gives_ibot_zero_and_gradients(centering):
    cfg = tiny(f"objective.centering={centering}")
    torch.manual_seed(0)
    model = GSDistill(cfg)
    batch = tensor_batch(cfg, 4, seed=0)
    batch["masks"][:] = False
    model.ibot_loss.center.fill_(0.5)
    center = model.ibot_loss.center.clone()
    terms = model(batch)
    assert terms["ibot"].item() == 0.0 and terms["ibot"].requires_grad
    assert torch.isfinite(terms["total"])
    terms["total"].backward()
    grads = {n: p.grad for n, p in model.student_parameters() if p.requires_grad}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["mask_token"].abs().sum() == 0  # on the graph, but nothing masked: zero gradient
    assert grads["backbone.patch_embed.proj.weight"].abs().sum() > 0  # the other terms still train
    torch.testing.assert_close(model.ibot_loss.center, center)  # no patch, no centre update


def test_empty_teacher_batch_and_ibot_divisor():
    assert sinkhorn_knopp(torch.zeros(0, 5), 0.1).shape == (0, 5)
    loss = IBOTPatchLoss(3)
    masks = torch.tensor([[True, False], [False, False], [False, False], [False, False]])
    student, teacher = torch.tensor([[0.0, 0.0, 0.0]]), torch.full((1, 3), 1 / 3)
    # one masked patch, 4 images: CE = log 3, divided by every image of the batch (DINOv2)
    assert loss(student, teacher, masks).item() == pytest.approx(torch.log(torch.tensor(3.0)).item() / 4)


def test_low_mask_probability_trains(tmp_path):
    cfg = tiny("views.mask_prob=0.05", "optim.steps=3")
    batches = [tensor_batch(cfg, 4, seed=s) for s in range(3)]
    batches[1]["masks"][:] = False
    run = run_pretraining(cfg, tmp_path, lambda r, w: FixedBatches(batches, r, w))
    rows = read_metrics(run / "metrics.csv")
    assert [float(r["ibot"]) for r in rows][1] == 0.0 and len(rows) == 3


# ---- 3. a reused run folder ----------------------------------------------------------------------
def test_reused_run_folder_is_refused_and_overwrite_keeps_no_checkpoint_of_the_old_run(tmp_path):
    from gsdistill.errors import GsdistillError
    old = tiny("train.ckpt_every=1", "train.keep_checkpoints=0")
    run_pretraining(old, tmp_path, fixed(old))  # leaves step-1 .. step-4
    new = tiny("optim.steps=2", "train.ckpt_every=1", "train.keep_checkpoints=1")
    with pytest.raises(GsdistillError):  # once, a second run pruned and mixed the first run's checkpoints
        run_pretraining(new, tmp_path, fixed(new))
    assert [p.name for p in checkpoint.checkpoints_in(tmp_path / "checkpoints")] == [f"step-00000{i}" for i in range(1, 5)]
    run_pretraining(new, tmp_path, fixed(new), overwrite=True)
    latest = checkpoint.resolve_checkpoint(tmp_path)
    assert latest.name == "step-000002" and checkpoint.read_state(latest)["step"] == 2
    assert [p.name for p in checkpoint.checkpoints_in(tmp_path / "checkpoints")] == ["step-000002"]
    assert steps_logged(tmp_path) == [1, 2]  # metrics of the new run only


def test_resumed_run_prunes_its_own_history_by_step(tmp_path):
    cfg = tiny("train.ckpt_every=1", "train.keep_checkpoints=2")
    run_pretraining(tiny("train.ckpt_every=1", "train.keep_checkpoints=2", "train.stop_after=2"), tmp_path, fixed(cfg))
    run_pretraining(tiny("train.ckpt_every=1", "train.keep_checkpoints=2", f"train.resume={tmp_path}"), None, fixed(cfg))
    assert [p.name for p in checkpoint.checkpoints_in(tmp_path / "checkpoints")] == ["step-000003", "step-000004"]


# ---- 4. resume from the checkpoint's config ------------------------------------------------------
def test_resume_starts_from_the_checkpoints_config(tmp_path, capsys):
    cfg = tiny("train.stop_after=2", "optim.lr=2e-4")
    run_pretraining(cfg, tmp_path, fixed(cfg))
    resumed, ckpt, changes = resume_config(None, [f"train.resume={tmp_path}"])  # none of the original overrides
    assert ckpt.name == "step-000002" and changes == []
    assert resumed.model.proj_dim == 32 and resumed.optim.lr == 2e-4 and resumed.train.stop_after is None
    run_pretraining(resumed, None, fixed(cfg))
    assert steps_logged(tmp_path) == [1, 2, 3, 4]
    _, _, changes = resume_config(None, [f"train.resume={tmp_path}", "optim.lr=1e-4"])
    assert changes == ["optim.lr: 0.0002 -> 0.0001"]


def test_failed_resume_writes_nothing_and_names_the_changed_keys(tmp_path):
    cfg = tiny("train.stop_after=2")
    run_pretraining(cfg, tmp_path, fixed(cfg))
    before = {p.name: p.read_bytes() for p in (tmp_path / "config.yaml", tmp_path / "metrics.csv")}
    other = tiny("model.proj_dim=16", f"train.resume={tmp_path}")
    with pytest.raises(InputError, match=r"model.safetensors: does not fit.*model.proj_dim: 32 -> 16"):
        run_pretraining(other, None, fixed(other))
    assert {p.name: p.read_bytes() for p in (tmp_path / "config.yaml", tmp_path / "metrics.csv")} == before


# ---- 7. damaged checkpoints ----------------------------------------------------------------------
def _truncate(path, keep=100):
    path.write_bytes(path.read_bytes()[:keep])


def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys):
    cfg = tiny("train.ckpt_every=1", "train.keep_checkpoints=0", "train.stop_after=3")
    run_pretraining(cfg, tmp_path, fixed(cfg))
    bad = tmp_path / "checkpoints" / "step-000003" / "model.safetensors"
    _truncate(bad)
    with pytest.raises(CorruptFileError, match=str(bad)):
        checkpoint.read_model(bad.parent)
    run_pretraining(tiny("train.ckpt_every=1", "train.keep_checkpoints=0", f"train.resume={tmp_path}"), None, fixed(cfg))
    err = capsys.readouterr().err
    assert str(bad) in err and "newest intact checkpoint" in err and "step-000002" in err
    assert steps_logged(tmp_path) == [1, 2, 3, 4]
    assert checkpoint.read_state(checkpoint.resolve_checkpoint(tmp_path))["step"] == 4
    # a damaged folder named explicitly is not replaced silently: the error names file and alternative
    _truncate(tmp_path / "checkpoints" / "step-000004" / "optimizer.pt")
    with pytest.raises(CorruptFileError, match=r"step-000004/optimizer.pt.*newest intact checkpoint before it is .*step-000003"):
        checkpoint.find_resumable(tmp_path / "checkpoints" / "step-000004")


def test_export_names_a_truncated_checkpoint(tmp_path, capsys):
    from gsdistill.cli import main
    cfg = tiny("train.ckpt_every=2", "train.keep_checkpoints=0")
    run_pretraining(cfg, tmp_path / "run", fixed(cfg))
    bad = tmp_path / "run" / "checkpoints" / "step-000004" / "model.safetensors"
    _truncate(bad, keep=bad.stat().st_size - 10)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and "step-000002" in err
    assert main(["export", str(bad.parent.parent / "step-000002"), str(tmp_path / "out")]) == 0


# ---- 8. divergence -------------------------------------------------------------------------------
def test_exploding_weights_stop_before_a_bad_checkpoint(tmp_path):
    cfg = tiny("train.ckpt_every=1", "train.stop_after=2")
    run_pretraining(cfg, tmp_path, fixed(cfg))
    wild = tiny("train.ckpt_every=1", "optim.lr=1e6", "optim.warmup_steps=0", f"train.resume={tmp_path}")
    with pytest.raises(TrainingDiverged, match=r"step 2: the weights exploded.*Last good checkpoint: .*step-000002"):
        run_pretraining(wild, None, fixed(cfg))
    good = checkpoint.resolve_checkpoint(tmp_path)
    assert good.name == "step-000002"
    weights = checkpoint.read_model(good)
    assert max(float(v.abs().max()) for k, v in weights.items() if k.startswith("backbone.")) < 100
    run_pretraining(tiny("train.ckpt_every=1", f"train.resume={tmp_path}"), None, fixed(cfg))  # sane lr: trains on
    assert steps_logged(tmp_path) == [1, 2, 3, 4]


def test_nan_in_the_data_names_the_page(tmp_path):
    cfg = tiny("train.ckpt_every=1")
    batches = [tensor_batch(cfg, 4, seed=s) for s in range(2)]
    batches[1]["sem_emb"][2, 0, 5] = float("nan")  # one cached span embedding of page 2 of batch 2
    with pytest.raises(NonFiniteBatch, match=r"step 1: NaN/inf in the input batch \(sem_emb of page\(s\) "
                                              r"\['page-1-2'\]\); the data is at fault, not optim.lr"):
        run_pretraining(cfg, tmp_path, lambda r, w: FixedBatches(batches, r, w))
    assert checkpoint.resolve_checkpoint(tmp_path).name == "step-000001"
