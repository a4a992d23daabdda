"""Training loop: resume equals uninterrupted, NaN stop, SIGTERM save, export, load_pretrained, CLI."""
from __future__ import annotations

import json
import os
import signal

import pytest
import timm
import torch
from safetensors.torch import load_file

from gsdistill.config import load_config
from gsdistill.models.backbone import load_backbone, read_backbone_meta
from gsdistill.pretrain import checkpoint
from gsdistill.pretrain.data_stream import FixedBatches, tensor_batch
from gsdistill.pretrain.loop import TrainingDiverged, TrainingInterrupted
from gsdistill.pretrain.metrics_log import read_metrics
from gsdistill.pretrain.run import run_pretraining

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "optim.batch_size=4", "optim.steps=6", "optim.warmup_steps=2", "train.log_every=1",
        "train.ckpt_every=100", "train.progress=false", "train.tensorboard=false", "train.plots=false"]


def tiny(*extra):
    return load_config("pretrain", None, TINY + list(extra))


def fixed(cfg, n=3):
    batches = [tensor_batch(cfg, 4, seed=s) for s in range(n)]
    return lambda rank, world: FixedBatches(batches, rank, world)


def losses(run_dir):
    return {int(r["step"]): {k: float(v) for k, v in r.items()} for r in read_metrics(run_dir / "metrics.csv")}


def test_resume_gives_the_same_losses_as_uninterrupted(tmp_path):
    # drop-path uses the RNG, softmax centering and the queue are buffers: all must be restored
    extra = ["model.backbone.drop_path_rate=0.2", "objective.centering=softmax", "objective.queue_size=16"]
    cfg = tiny(*extra)
    full = losses(run_pretraining(cfg, tmp_path / "full", fixed(cfg)))
    part_dir = run_pretraining(tiny(*extra, "train.stop_after=3"), tmp_path / "part", fixed(cfg))
    assert checkpoint.read_state(checkpoint.resolve_checkpoint(part_dir))["step"] == 3
    resumed = losses(run_pretraining(tiny(*extra, f"train.resume={part_dir}"), None, fixed(cfg)))
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6]
    for step in (4, 5, 6):
        for term in ("total", "sem", "geom", "distill", "ibot", "koleo", "grad_norm"):
            assert resumed[step][term] == pytest.approx(full[step][term], rel=1e-6, abs=1e-7), (step, term)
    assert full[6]["total"] != pytest.approx(full[5]["total"])


class NaNAtStep(FixedBatches):
    def __init__(self, batches, bad_step):
        super().__init__(batches)
        self.bad_step = bad_step

    def __next__(self):
        batch = super().__next__()
        if self.position["batch"] == self.bad_step:
            batch = dict(batch, global_crops=torch.full_like(batch["global_crops"], float("nan")))
        return batch


def test_nan_loss_stops_with_message_and_keeps_last_good_checkpoint(tmp_path):
    cfg = tiny("train.ckpt_every=2")
    batches = [tensor_batch(cfg, 4, seed=0)]
    with pytest.raises(TrainingDiverged, match=r"step 3: .*NaN/inf.*Last good checkpoint: .*step-000002"):
        run_pretraining(cfg, tmp_path, lambda r, w: NaNAtStep(batches, bad_step=4))
    ckpt = checkpoint.resolve_checkpoint(tmp_path)
    assert ckpt.name == "step-000002"
    assert all(torch.isfinite(v).all() for v in checkpoint.read_model(ckpt).values() if v.is_floating_point())
    assert not list((tmp_path / "checkpoints").glob(".tmp-*")), "no half-written checkpoint"


class SignalAtStep(FixedBatches):
    def __next__(self):
        batch = super().__next__()
        if self.position["batch"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return batch


def test_sigterm_saves_a_checkpoint_then_stops(tmp_path):
    cfg = tiny()
    batches = [tensor_batch(cfg, 4, seed=0)]
    with pytest.raises(TrainingInterrupted, match="step 3"):
        run_pretraining(cfg, tmp_path, lambda r, w: SignalAtStep(batches))
    state = checkpoint.read_state(checkpoint.resolve_checkpoint(tmp_path))
    assert state["step"] == 3 and state["data_position"] == {"epoch": 0, "batch": 3}
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler, None)


def test_export_load_pretrained_and_cli(tmp_path):
    cfg = tiny("optim.steps=2", "train.plots=true", "train.tensorboard=true")
    run_dir = run_pretraining(cfg, tmp_path / "run", fixed(cfg))
    assert (run_dir / "plots" / "loss_terms.png").is_file() and (run_dir / "plots" / "grad_norm.png").is_file()
    assert list((run_dir / "tb").iterdir()) and (run_dir / "config.yaml").is_file()
    model = checkpoint.load_pretrained(run_dir)
    assert not model.training
    state = load_file(str(run_dir / "checkpoints" / "step-000002" / "model.safetensors"))
    torch.testing.assert_close(model.backbone.pos_embed, state["backbone.pos_embed"])
    images = tensor_batch(cfg, 2, seed=9)["global_crops"][:2]
    with torch.no_grad():
        emb = model.embed_pages(images)
        backbone = load_backbone(run_dir / "backbone")
        torch.testing.assert_close(backbone.eval()(images), model.page_features(images))
    assert emb.shape == (2, 32)
    # the CLI export equals the automatic one; timm alone builds it
    from gsdistill.cli import main
    assert main(["export", str(run_dir), str(tmp_path / "exported")]) == 0
    exported = load_file(str(tmp_path / "exported" / "backbone.safetensors"))
    auto = load_file(str(run_dir / "backbone" / "backbone.safetensors"))
    assert exported.keys() == auto.keys() and all(torch.equal(exported[k], auto[k]) for k in auto)
    meta = read_backbone_meta(tmp_path / "exported")
    net = timm.create_model(meta["model_name"], pretrained=True, **meta["kwargs"],
                            pretrained_cfg_overlay={"file": str(tmp_path / "exported" / "backbone.safetensors")})
    torch.testing.assert_close(net.pos_embed, model.backbone.pos_embed)
    assert main(["export", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2
    # --weights teacher: the EMA teacher's backbone, which the update moved away from the student's
    assert main(["export", str(run_dir), str(tmp_path / "teacher"), "--weights", "teacher"]) == 0
    teacher = load_file(str(tmp_path / "teacher" / "backbone.safetensors"))
    assert teacher.keys() == auto.keys()
    assert all(torch.equal(teacher[k], state[f"teacher.backbone.{k}"]) for k in teacher)
    assert any(not torch.equal(teacher[k], auto[k]) for k in auto)
    assert read_backbone_meta(tmp_path / "teacher")["weights"] == "teacher"
    from gsdistill.errors import InputError
    from gsdistill.pretrain.run import export_backbone
    student_only = {k: v for k, v in state.items() if not k.startswith("teacher.")}
    with pytest.raises(InputError, match="no teacher backbone.*without an EMA teacher"):
        export_backbone(student_only, cfg, tmp_path / "none", source="s", weights="teacher")
    with pytest.raises(InputError, match="choose one of student, teacher"):
        export_backbone(state, cfg, tmp_path / "none", weights="ema")


def test_cli_rejects_unknown_keys_and_resume_with_other_world_size(tmp_path, capsys):
    from gsdistill.cli import main
    assert main(["pretrain", "optim.stepz=3"]) == 2
    assert "did you mean 'optim.steps'" in capsys.readouterr().err
    cfg = tiny("optim.steps=1")
    run_dir = run_pretraining(cfg, tmp_path, fixed(cfg))
    state_path = checkpoint.resolve_checkpoint(run_dir) / checkpoint.STATE_FILE
    state = json.loads(state_path.read_text())
    state_path.write_text(json.dumps(dict(state, world_size=2)))
    with pytest.raises(ValueError, match="written by 2 ranks"):
        run_pretraining(tiny(f"train.resume={run_dir}"), None, fixed(cfg))


def test_bf16_autocast_trains_with_finite_losses(tmp_path):
    cfg = tiny("optim.steps=2", "train.precision=bf16")
    rows = losses(run_pretraining(cfg, tmp_path, fixed(cfg)))
    fp32 = losses(run_pretraining(tiny("optim.steps=2"), tmp_path / "fp32", fixed(cfg)))
    assert all(torch.isfinite(torch.tensor(r["total"])) for r in rows.values())
    assert rows[1]["total"] == pytest.approx(fp32[1]["total"], rel=0.05)
    assert rows[1]["total"] != fp32[1]["total"], "bf16 matmuls round differently"


def test_a_checkpoint_from_before_a_new_key_still_loads(tmp_path):
    """A checkpoint's config.yaml written before a key existed (here: objective.patch_spread) loads
    with that key's default; a key that no longer exists is refused with the file named."""
    import yaml
    from gsdistill.config import ConfigError
    cfg = tiny("optim.steps=1")
    run_dir = run_pretraining(cfg, tmp_path / "run", fixed(cfg, 1))
    ckpt = checkpoint.resolve_checkpoint(run_dir)
    saved = yaml.safe_load((ckpt / "config.yaml").read_text())
    for key in ("patch_spread", "lambda_patch_spread", "patch_spread_cov"):
        del saved["objective"][key]
    (ckpt / "config.yaml").write_text(yaml.safe_dump(saved))
    model = checkpoint.load_pretrained(run_dir)
    assert model.use_patch_spread is False
    saved["objective"]["retired_key"] = 1
    (ckpt / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ConfigError, match="retired_key"):
        checkpoint.load_pretrained(run_dir)
