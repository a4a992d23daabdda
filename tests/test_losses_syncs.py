"""Value checks can be switched off, and then the pretraining losses make no host sync."""
from __future__ import annotations

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.losses import (
    DINOLoss, IBOTPatchLoss, JointLH, KoLeoHybridLoss, ListNetLoss, SumMargLH, sinkhorn_knopp,
)
from gsdistill.losses.syncs import HostSyncCounter
from gsdistill.losses.validation import checks, checks_enabled, set_checks
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import host_indices, tensor_batch

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32"]


def test_switch_defaults_on_and_the_context_manager_restores_it():
    assert checks_enabled()
    with checks(False):
        assert not checks_enabled()
        with checks(True):
            assert checks_enabled()
        assert not checks_enabled()
    assert checks_enabled()
    set_checks(False)
    try:
        assert not checks_enabled()
    finally:
        set_checks(True)


def test_checks_on_give_the_clear_errors_and_off_skip_only_value_checks():
    scores, pos = torch.randn(3, 5), torch.rand(3, 5) < 0.5
    pos[0, 0] = True
    bad = scores.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"SumMargLH: scores contain 1 NaN/inf values \(shape \(3, 5\)\)"):
        SumMargLH()(bad, pos)
    with pytest.raises(ValueError, match="ListNetLoss: labels must be relevance grades >= 0, got min -1.0"):
        ListNetLoss()(scores, -torch.ones(3, 5))
    with checks(False):  # shape and dtype errors cost no sync: they stay
        with pytest.raises(ValueError, match=r"positives shape \(3, 4\) does not match scores shape"):
            SumMargLH()(scores, pos[:, :4])
        with pytest.raises(ValueError, match="must be a bool mask"):
            JointLH()(scores, pos.float())
        assert torch.isnan(SumMargLH()(bad, pos))  # a NaN is no longer caught: it flows through


@pytest.mark.parametrize("loss_cls", [SumMargLH, JointLH])
def test_sync_free_dense_path_equals_the_gathered_path(loss_cls):
    torch.manual_seed(0)
    scores = (3 * torch.randn(7, 40, dtype=torch.float64)).requires_grad_()
    pos = torch.rand(7, 40) < 0.15
    pos[2] = False  # an anchor without positives: left out of the mean
    valid = torch.rand(7, 40) < 0.9
    values, grads, stats = [], [], []
    for on in (True, False):
        loss = loss_cls()
        with checks(on):
            out = loss(scores, pos, valid)
        values.append(out.detach())
        grads.append(torch.autograd.grad(out, scores)[0])
        stats.append({k: float(v) for k, v in loss.last_stats.items()})
    torch.testing.assert_close(values[0], values[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)
    assert stats[0] == stats[1]
    n_used = float(((pos & valid).sum(1) > 0).sum())
    assert (stats[0]["anchors_used"], stats[0]["anchors_without_positive"]) == (n_used, 7 - n_used)
    assert n_used < 7  # row 2 has no positive


def test_sinkhorn_logit_bound_and_sync_free_log_domain_give_the_same_targets():
    torch.manual_seed(0)
    logits = torch.nn.functional.normalize(torch.randn(12, 6), dim=1) @ \
        torch.nn.functional.normalize(torch.randn(20, 6), dim=1).T  # cosines, |t| <= 1
    ref = sinkhorn_knopp(logits, 0.04, 3)
    torch.testing.assert_close(sinkhorn_knopp(logits, 0.04, 3, logit_bound=1.0), ref)
    with checks(False), HostSyncCounter() as syncs:
        log_domain = sinkhorn_knopp(logits, 0.04, 3)  # no bound: the log domain, no range read back
        bounded = sinkhorn_knopp(logits, 0.04, 3, logit_bound=1.0)
    torch.testing.assert_close(log_domain, ref, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(bounded, ref)
    assert syncs.total == 0


def test_counter_sees_reads_and_data_dependent_shapes():
    x, mask = torch.arange(6.0), torch.tensor([True, False] * 3)
    with HostSyncCounter() as syncs:
        int(x.sum()), x[mask], x.nonzero(), x.tolist()
        x[torch.tensor([0, 2])], torch.repeat_interleave(x, torch.full((6,), 2), output_size=12)
    assert syncs.total == 4  # item, bool-mask index, nonzero, tolist; not the index list nor sized repeat


def test_distill_losses_make_no_sync_with_checks_off():
    torch.manual_seed(0)
    masks = torch.rand(4, 9) < 0.4
    n = int(masks.sum())
    dino, ibot, koleo = DINOLoss(16), IBOTPatchLoss(16), KoLeoHybridLoss()
    s_views, t_views = [torch.randn(5, 16) for _ in range(3)], [torch.softmax(torch.randn(5, 16), 1)] * 2
    s_patch, t_patch = torch.randn(n, 16), torch.softmax(torch.randn(n, 16), 1)
    x, groups = torch.randn(8, 16), torch.arange(8) % 4
    on = [dino(s_views, t_views), ibot(s_patch, t_patch, masks), koleo(x, group_ids=groups)]
    with checks(False), HostSyncCounter() as syncs:
        off = [dino(s_views, t_views), ibot(s_patch, t_patch, masks), koleo(x, group_ids=groups)]
    assert syncs.total == 0, dict(syncs.where)
    for a, b in zip(on, off):
        torch.testing.assert_close(a, b)


def test_gsdistill_step_makes_no_sync_inside_losses_with_checks_off():
    cfg = load_config("pretrain", None, TINY)
    torch.manual_seed(0)
    model = GSDistill(cfg)
    batch = tensor_batch(cfg, 4, seed=0)
    with HostSyncCounter() as on_syncs:
        on = model(batch)
        on["total"].backward()
    assert on_syncs.inside("gsdistill/losses/")  # the checks are there by default ...
    model.zero_grad()
    model.steps_seen.zero_()
    with checks(False), HostSyncCounter() as syncs:
        off = model(batch)
        off["total"].backward()
    assert syncs.inside("gsdistill/losses/") == {}  # ... and gone when switched off
    for key in on:
        torch.testing.assert_close(on[key], off[key], rtol=1e-5, atol=1e-6)
    # only the iBOT mask's nonzero is left, and the data pipeline can hand its result over
    assert list(syncs.where) == [k for k in syncs.where if k.startswith("nonzero @ gsdistill/models/")]
    batch.update(host_indices(batch["masks"]))
    with checks(False), HostSyncCounter() as syncs:
        model(batch)["total"].backward()
    assert syncs.total == 0, dict(syncs.where)


def test_dense_path_keeps_the_half_precision_contract():
    torch.manual_seed(0)
    scores = (5 * torch.randn(6, 30)).bfloat16().requires_grad_()
    pos = torch.rand(6, 30) < 0.2
    pos[:, 0] = True
    ref = SumMargLH()(scores, pos)
    with checks(False):
        off = SumMargLH()(scores, pos)
    assert ref.dtype == off.dtype == torch.float32  # half logits: float32 loss on both paths
    torch.testing.assert_close(off, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(torch.autograd.grad(off, scores)[0], torch.autograd.grad(ref, scores)[0])
