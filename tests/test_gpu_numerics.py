"""bf16 autocast (what `train.precision: bf16` runs on a GPU), proven on the CPU: the prototype logits,
the DINO / iBOT cross-entropies, Sinkhorn-Knopp and softmax centering, KoLeo and the alignment scores
compute in float32 and return float32, one test per loss file, and every term of the model's loss
dict is float32 and within tolerance of an fp32 run (issue 22, row 7).

Tolerances: a loss given the same float32 inputs must give the same value under autocast as without
(1e-6: both run in float32; before the fix bf16's 2^-8 mantissa step moved them by 1e-3 and more).
For the whole model the backbone itself runs in bf16 under autocast, so its features are not the
fp32 run's: the terms are compared to fp32 at 2e-2 (measured on this tiny model: 5e-3 at most),
and each loss is re-evaluated in float64 on the very inputs it got under autocast (1e-5).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gsdistill.config import load_config
from gsdistill.losses import DINOLoss, IBOTPatchLoss, KoLeoHybridLoss, KoLeoLoss, PatchSpreadLoss, sinkhorn_knopp
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.models.heads import DINOHead
from gsdistill.pretrain.data_stream import tensor_batch

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32"]


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _cosines(rows: int, k: int = 256, seed: int = 0) -> torch.Tensor:
    """Logits like the DINO head's: cosines of nearby unit vectors (a spread of a few 1e-3)."""
    g = torch.Generator().manual_seed(seed)
    protos = F.normalize(torch.randn(k, 32, generator=g), dim=1)
    x = F.normalize(protos[0] + 0.05 * torch.randn(rows, 32, generator=g), dim=1)
    return x @ protos.T


def _same(fn, *inputs):
    """fn(*inputs) without autocast, and under bf16 autocast: both float32 and equal to 1e-6."""
    ref = fn(*inputs)
    with bf16():
        out = fn(*inputs)
    assert out.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    return out


def test_dino_head_prototype_logits_are_float32_under_autocast():
    torch.manual_seed(0)
    head, x = DINOHead(24, out_dim=512, hidden_dim=48, bottleneck_dim=16), torch.randn(6, 24)
    with bf16():
        logits = head(x)
    assert logits.dtype == torch.float32
    # the same bf16 MLP output, projected in float64: the fp32 cosines match to 1e-6, bf16's did not
    with bf16():
        hidden = head.mlp(x)
    exact = F.normalize(hidden.double(), dim=-1, eps=1e-6) @ F.normalize(head.prototypes.double(), dim=-1).T
    torch.testing.assert_close(logits.double(), exact, rtol=0, atol=1e-6)


def test_dino_loss_float32_under_autocast_and_for_bf16_logits():
    torch.manual_seed(0)
    student = [10 * _cosines(8, seed=s) for s in range(4)]
    teacher = [sinkhorn_knopp(_cosines(8, seed=10 + s), 0.04) for s in range(2)]
    loss = DINOLoss(256)
    _same(lambda *s: loss(list(s), teacher), *student)
    out = loss([s.bfloat16() for s in student], [t.bfloat16() for t in teacher])
    assert out.dtype == torch.float32  # bf16 inputs: the term still comes back in float32


def test_ibot_loss_float32_under_autocast_and_for_bf16_logits():
    torch.manual_seed(0)
    masks = torch.rand(4, 9) < 0.5
    n = int(masks.sum())
    student, teacher = 10 * _cosines(n), sinkhorn_knopp(_cosines(n, seed=1), 0.04)
    loss = IBOTPatchLoss(256)
    _same(lambda s: loss(s, teacher, masks), student)
    assert loss(student.bfloat16(), teacher.bfloat16(), masks).dtype == torch.float32
    assert loss(student[:0].bfloat16(), teacher[:0], torch.zeros_like(masks)).dtype == torch.float32


@pytest.mark.parametrize("loss", [KoLeoLoss(), KoLeoHybridLoss()], ids=["koleo", "koleo_hybrid"])
def test_koleo_losses_float32_under_autocast(loss):
    torch.manual_seed(0)
    x = F.normalize(torch.randn(1, 32) + 0.02 * torch.randn(12, 32), dim=1)  # close rows: cosines near 1
    if isinstance(loss, KoLeoHybridLoss):
        _same(lambda v: loss(v, group_ids=torch.arange(12) % 6), x)
    else:
        _same(loss, x)
    assert loss(x.bfloat16()).dtype == torch.float32


def test_patch_spread_float32_under_autocast():
    """The covariance of near-identical tokens (a collapsed map) must not be computed in bf16."""
    torch.manual_seed(0)
    x = torch.randn(1, 32) + 0.01 * torch.randn(200, 32)
    loss = PatchSpreadLoss()
    _same(loss, x)
    assert loss(x.bfloat16()).dtype == torch.float32


@pytest.mark.parametrize("centering", ["sinkhorn_knopp", "softmax"])
def test_teacher_targets_float32_for_bf16_logits(centering):
    logits = _cosines(16)
    ref = DINOLoss(256).teacher_probs(logits, 0.04, centering=centering)
    with bf16():
        same = DINOLoss(256).teacher_probs(logits, 0.04, centering=centering)
    torch.testing.assert_close(same, ref, rtol=1e-6, atol=1e-7)
    rounded = DINOLoss(256).teacher_probs(logits.bfloat16(), 0.04, centering=centering)
    assert rounded.dtype == torch.float32  # bf16 logits (a bf16 teacher): targets still float32
    centre = DINOLoss(256)
    centre.update_center(logits.bfloat16())
    assert centre.center.dtype == torch.float32


def _model_terms(autocast: bool, extra=(), capture=None):
    cfg = load_config("pretrain", None, TINY + list(extra))
    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    batch = tensor_batch(cfg, 4, seed=0)
    if capture is not None:  # record each loss module's inputs and output
        for name, module in [("distill", model.dino_loss), ("ibot", model.ibot_loss), ("koleo", model.koleo_loss)]:
            module.register_forward_hook(
                lambda m, args, kwargs, out, name=name: capture.append((name, m, args, kwargs, out)),
                with_kwargs=True)
    if autocast:
        with bf16():
            return model(batch)
    return model(batch)


@pytest.mark.parametrize("extra", [[], ["objective.centering=softmax", "objective.align_views=visible",
                                        "objective.symmetric=true"]], ids=["default", "softmax_visible"])
def test_every_model_term_is_float32_under_bf16_autocast(extra):
    ref = _model_terms(False, extra)
    out = _model_terms(True, extra)
    assert set(out) == set(ref) >= {"sem", "geom", "distill", "ibot", "koleo", "total"}
    for key, value in out.items():
        assert value.dtype == torch.float32, key
        # the bf16 backbone moves the features, so the terms move too (5e-3 at most measured here)
        assert abs(float(value.detach()) - float(ref[key].detach())) < 2e-2, (key, float(value), float(ref[key]))


def test_model_losses_match_float64_on_the_inputs_they_got_under_autocast():
    calls = []
    _model_terms(True, capture=calls)
    assert {c[0] for c in calls} == {"distill", "ibot", "koleo"}
    for name, module, args, kwargs, out in list(calls):  # (the re-evaluations below append too)
        assert out.dtype == torch.float32, name

        def lift(v):
            if isinstance(v, list):
                return [lift(x) for x in v]
            return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        exact = module(*lift(list(args)), **{k: lift(v) for k, v in kwargs.items()})
        assert abs(float(out.detach()) - float(exact.detach())) < 1e-5, (name, float(out), float(exact))
