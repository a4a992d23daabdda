"""The torch engine's step needs no host sync between forward and backward: a non-finite step is
skipped on the device (fused AdamW's ``found_inf``, the EMA weight zeroed) and reported after it."""
from __future__ import annotations

import copy

import pytest
import torch

from gsdistill.losses.syncs import HostSyncCounter
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import FixedBatches, host_indices, tensor_batch
from gsdistill.pretrain.engine_torch import TorchEngine
from gsdistill.pretrain.loop import NonFiniteBatch, Trainer
from test_pretrain_train import NaNAtStep, tiny


def _trainer(tmp_path, batches) -> Trainer:
    cfg = tiny("train.ckpt_every=1000")
    torch.manual_seed(0)
    engine = TorchEngine(GSDistill(cfg), cfg, torch.device("cpu"))
    assert engine.guards_on_device  # torch's fused AdamW runs on the CPU too
    return Trainer(cfg, tmp_path, engine, batches)


class _Same(FixedBatches):
    """The same batch every step, host indices included (FixedBatches recomputes them per rank)."""

    def __init__(self, batch):
        super().__init__([batch])
        self.batch = batch

    def __next__(self):
        super().__next__()
        return self.batch


def test_no_host_sync_between_forward_and_backward(tmp_path):
    cfg = tiny()
    batch = tensor_batch(cfg, 4, seed=0)
    batch.update(host_indices(batch["masks"]))  # as the data pipeline hands them over
    trainer = _trainer(tmp_path, _Same(batch))
    engine, gaps, starts = trainer.engine, [], []
    counter = HostSyncCounter()
    forward, backward = engine.forward, engine.backward_step

    def timed_forward(batch):
        starts.append(counter.total)
        out = forward(batch)
        gaps.append(counter.total)
        return out

    def timed_backward(total, lr):
        gaps[-1] = counter.total - gaps[-1]
        return backward(total, lr)

    engine.forward, engine.backward_step = timed_forward, timed_backward
    with counter:
        trainer.plan.stop_after = 4
        trainer.fit()
    # the first step reads the initial weight norm (once per run); then nothing until the update
    assert gaps[1:] == [0, 0, 0], gaps
    per_step = [b - a for a, b in zip(starts, starts[1:] + [counter.total])]
    assert per_step[1:] == [1, 1, 1], (per_step, dict(counter.where))  # the loop's one read, nothing else
    assert trainer.host_syncs == 4 + 0  # one read of terms and norms per step, after the update


def test_a_non_finite_step_changes_nothing_on_the_device(tmp_path):
    cfg = tiny()
    trainer = _trainer(tmp_path, NaNAtStep([tensor_batch(cfg, 4, seed=0)], bad_step=4))
    trainer.plan.stop_after = 3
    trainer.fit()
    model, optimizer = trainer.engine.module, trainer.engine.optimizer
    weights = copy.deepcopy(model.state_dict())
    moments = copy.deepcopy(optimizer.state_dict()["state"])
    trainer.plan.stop_after = 5
    with pytest.raises(NonFiniteBatch, match=r"step 3: NaN/inf in the input batch"):
        trainer.fit()
    after = model.state_dict()
    changed = [k for k, v in weights.items() if v.is_floating_point() and not torch.equal(v, after[k])
               and k != "steps_seen"]
    assert changed == []  # student, teacher (EMA skipped), centres: all as after step 3
    for i, state in optimizer.state_dict()["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state[key], moments[i][key]), (i, key)
    assert trainer.step == 3


def test_skip_flag_keeps_the_teacher(tmp_path):
    model = GSDistill(tiny())
    before = [t.clone() for t, _ in model.teacher_pairs()]
    for _, s in model.teacher_pairs():
        s.data.add_(1.0)
    model.update_teacher(0.5, skip=torch.ones(()))
    assert all(torch.equal(a, t) for a, (t, _) in zip(before, model.teacher_pairs()))
    model.update_teacher(0.5, skip=torch.zeros(()))
    moved = [t for t, _ in model.teacher_pairs()]
    assert all(torch.allclose(m, b + 0.5) for m, b in zip(moved, before))
