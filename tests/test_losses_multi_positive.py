"""Multi-positive losses: InfoNCE equivalence, paper 000 gradient closed forms, Lemma 5, bad input."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gsdistill.losses import (
    JointLH, LogitScale, LSEPair, MultiPositiveBCE, Rand1LH, SingleLH, SumMargLH, get_loss,
)
from gsdistill.losses.multi_positive import first_positive_index, random_positive_index

MP_NAMES = ["single_lh", "infonce", "rand1_lh", "joint_lh", "sum_marg_lh", "mpcl", "lse_pair"]


def random_case(b=6, n=11, max_pos=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g, dtype=dtype) * 2
    n_pos = torch.randint(1, max_pos + 1, (b,), generator=g)
    order = torch.rand(b, n, generator=g).argsort(dim=1)
    positives = order < n_pos[:, None]
    return scores, positives


@pytest.mark.parametrize("name", MP_NAMES)
def test_one_positive_equals_cross_entropy(name):
    scores, _ = random_case(b=8, n=13, seed=1)
    target = torch.randint(0, 13, (8,), generator=torch.Generator().manual_seed(2))
    positives = F.one_hot(target, 13).bool()
    a = scores.clone().requires_grad_(True)
    b = scores.clone().requires_grad_(True)
    loss = get_loss(name)(a, positives)
    ref = F.cross_entropy(b, target)
    loss.backward(), ref.backward()
    assert torch.allclose(loss, ref, atol=1e-12)
    assert torch.allclose(a.grad, b.grad, atol=1e-12)


def test_single_lh_positive_index_is_cross_entropy_with_padding():
    scores, _ = random_case(b=5, n=9, seed=3)
    target = torch.tensor([0, 3, 8, 2, 5])
    valid = torch.ones(5, 9, dtype=torch.bool)
    valid[:, 6:] = False
    valid[2, 8] = True
    loss = SingleLH()(scores, None, valid, positive_index=target)
    ref = F.cross_entropy(scores.masked_fill(~valid, -math.inf), target)
    assert torch.allclose(loss, ref, atol=1e-12)


def softmax_grad_case(seed=4):
    scores, positives = random_case(b=7, n=10, max_pos=5, seed=seed)
    x = scores.clone().requires_grad_(True)
    return scores, positives, x


def test_joint_lh_gradient_eq10():
    scores, positives, x = softmax_grad_case()
    JointLH()(x, positives).backward()
    probs = scores.softmax(dim=1)
    n_pos = positives.sum(1, keepdim=True).double()
    expected = (probs - positives.double() / n_pos) / scores.shape[0]
    assert torch.allclose(x.grad, expected, atol=1e-12)
    # on positives exactly eq. 10: P(d_i+) - 1/|D+| (per anchor, before the batch mean)
    assert torch.allclose((x.grad * scores.shape[0])[positives], (probs - 1 / n_pos)[positives])


def test_sum_marg_lh_gradient_eq11():
    scores, positives, x = softmax_grad_case(seed=5)
    SumMargLH()(x, positives).backward()
    e = scores.exp()
    z_all = e.sum(1, keepdim=True)
    z_pos = (e * positives).sum(1, keepdim=True)
    eq11 = (e / z_all) * (1 - z_all / z_pos)
    per_anchor_grad = x.grad * scores.shape[0]
    assert torch.allclose(per_anchor_grad[positives], eq11[positives], atol=1e-12)
    assert torch.allclose(per_anchor_grad[~positives], (e / z_all)[~positives], atol=1e-12)


def test_lse_pair_gradient_eq12():
    scores, positives, x = softmax_grad_case(seed=6)
    LSEPair()(x, positives).backward()
    e_neg = (scores.exp() * ~positives).sum(1, keepdim=True)
    e_inv_pos = ((-scores).exp() * positives).sum(1, keepdim=True)
    z = 1 + e_neg * e_inv_pos
    eq12 = -(-scores).exp() * e_neg / z
    per_anchor_grad = x.grad * scores.shape[0]
    assert torch.allclose(per_anchor_grad[positives], eq12[positives], atol=1e-12)


def test_lse_pair_matches_explicit_double_sum():
    scores, positives = random_case(b=4, n=8, seed=7)
    diffs = scores[:, None, :] - scores[:, :, None]  # [b, p, n] = s_n - s_p
    pair = positives[:, :, None] & ~positives[:, None, :]
    explicit = torch.log1p((diffs.exp() * pair).sum(dim=(1, 2))).mean()
    assert torch.allclose(LSEPair()(scores, positives), explicit, atol=1e-12)


@pytest.mark.parametrize("name", MP_NAMES + ["bce"])
def test_gradcheck_float64(name):
    scores, positives = random_case(b=3, n=6, seed=8)
    valid = torch.ones_like(positives)
    valid[0, -1] = valid[1, 0] = False
    x = scores.clone().requires_grad_(True)
    loss = get_loss(name, seed=0) if name == "rand1_lh" else get_loss(name)
    if name == "rand1_lh":  # fixed draw across gradcheck's repeated calls
        assert torch.autograd.gradcheck(
            lambda s: loss(s, positives, valid, generator=torch.Generator().manual_seed(1)), (x,))
    else:
        assert torch.autograd.gradcheck(lambda s: loss(s, positives, valid), (x,))


def test_lemma5_mpcl_le_max_positive_le_single_positive():
    """Paper 003 Lemma 5, pointwise per anchor and for every choice of the SP positive."""
    scores, positives = random_case(b=16, n=20, max_pos=6, seed=9)
    for b in range(16):
        s, p = scores[b:b + 1], positives[b:b + 1]
        mpcl = SumMargLH()(s, p)
        best = torch.where(p, s, torch.full_like(s, -math.inf)).argmax(dim=1)
        max_pos = SingleLH()(s, p, positive_index=best)
        for j in p[0].nonzero().flatten():
            single = SingleLH()(s, p, positive_index=j.view(1))
            assert mpcl <= max_pos + 1e-12 <= single + 2e-12


def test_bce_matches_torch_reference():
    scores, positives = random_case(b=5, n=9, seed=10)
    valid = torch.rand(5, 9, generator=torch.Generator().manual_seed(0)) > 0.2
    valid |= positives
    loss = MultiPositiveBCE()(scores, positives, valid)
    ref = F.binary_cross_entropy_with_logits(scores, positives.double(), reduction="none")
    assert torch.allclose(loss, (ref * valid).sum() / 5, atol=1e-12)


def test_valid_padding_equals_dropping_columns():
    scores, positives = random_case(b=4, n=10, seed=11)
    keep = torch.tensor([1, 1, 0, 1, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    positives[:, 0] = True
    valid = keep.expand(4, -1).clone()
    for name in ["joint_lh", "mpcl", "lse_pair", "single_lh", "bce"]:
        padded = get_loss(name)(scores, positives, valid)
        dropped = get_loss(name)(scores[:, keep], positives[:, keep])
        assert torch.allclose(padded, dropped, atol=1e-12), name


def test_anchor_without_positive_is_excluded_and_counted():
    scores, positives = random_case(b=5, n=8, seed=12)
    positives[2] = False
    for cls in [SingleLH, Rand1LH, JointLH, SumMargLH, LSEPair, MultiPositiveBCE]:
        loss_fn = cls()
        full = loss_fn(scores, positives)
        assert loss_fn.last_stats["anchors_used"] == 4
        assert loss_fn.last_stats["anchors_without_positive"] == 1
        keep = torch.tensor([0, 1, 3, 4])
        if cls is not Rand1LH:
            assert torch.allclose(full, cls()(scores[keep], positives[keep]), atol=1e-12)
    x = scores.clone().requires_grad_(True)
    none = SumMargLH()(x, torch.zeros_like(positives))
    none.backward()
    assert none.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(x))


def test_anchor_without_negative_is_counted_and_finite():
    scores = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    positives = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    for cls in [SingleLH, JointLH, SumMargLH, LSEPair]:
        loss_fn = cls()
        loss = loss_fn(scores, positives)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(scores.grad).all()
        assert loss_fn.last_stats["anchors_without_negative"] == 1
        scores.grad = None
    only_pos = SumMargLH()(scores[:1], positives[:1])
    assert only_pos.item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("name", MP_NAMES + ["bce"])
def test_bad_input(name):
    scores, positives = random_case(b=3, n=5, seed=13)
    loss = get_loss(name)
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(3, 5\)"):
        loss(scores, positives[:, :4])
    for bad in (math.nan, math.inf, -math.inf):
        broken = scores.clone()
        broken[1, 2] = bad
        with pytest.raises(ValueError, match="NaN/inf"):
            loss(broken, positives)
    with pytest.raises(ValueError, match="bool"):
        loss(scores, positives.float())


def test_rand1_lh_seeded_and_uniform():
    positives = torch.zeros(4000, 6, dtype=torch.bool)
    positives[:, 1] = positives[:, 3] = positives[:, 4] = True
    positives[0] = False
    picks = random_positive_index(positives, torch.Generator().manual_seed(0))
    assert picks[0] == -1
    counts = torch.bincount(picks[1:], minlength=6).double() / 3999
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.allclose(counts[[1, 3, 4]], torch.full((3,), 1 / 3, dtype=torch.float64), atol=0.03)
    again = random_positive_index(positives, torch.Generator().manual_seed(0))
    assert torch.equal(picks, again)
    assert first_positive_index(positives)[1] == 1
    scores = torch.randn(4000, 6)
    a, b = Rand1LH(seed=3)(scores, positives), Rand1LH(seed=3)(scores, positives)
    assert torch.equal(a, b)


def test_logit_scale():
    ls = LogitScale(0.07)
    sims = torch.tensor([0.5, -1.0])
    assert torch.allclose(ls(sims), sims / 0.07, rtol=1e-5)
    assert abs(ls.temperature - 0.07) < 1e-6
    with torch.no_grad():
        ls.log_scale.fill_(10.0)
    assert torch.allclose(ls(sims), sims * 100.0, rtol=1e-5)
    fixed = LogitScale(0.5, learnable=False)
    assert not list(fixed.parameters()) and "log_scale" in fixed.state_dict()
    ls2 = LogitScale(0.07)
    ls2(torch.ones(3)).sum().backward()
    assert ls2.log_scale.grad is not None and ls2.log_scale.grad.item() == pytest.approx(3 / 0.07, rel=1e-5)
    with pytest.raises(ValueError):
        LogitScale(0.0)


def test_registry_did_you_mean():
    with pytest.raises(ValueError, match="did you mean 'lse_pair'"):
        get_loss("lse_pairs")
    assert isinstance(get_loss("MPCL"), SumMargLH)
    with pytest.raises(ValueError, match="bad arguments"):
        get_loss("joint_lh", nonsense=1)
