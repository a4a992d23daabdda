"""Graded list-wise losses (paper 002): Wasserstein closed forms and scipy, KL, ListNet, RankNet,
ApproxNDCG."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn.functional as F

from gsdistill.losses import (
    ApproxNDCGLoss, KLListLoss, ListNetLoss, RankNetLoss, WassersteinLoss, gaussian_w2_from_samples,
    get_loss,
)

GRADED = ["wasserstein", "kl", "listnet", "ranknet", "approx_ndcg"]


def graded_case(b=6, n=12, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g, dtype=dtype)
    labels = torch.zeros(b, n, dtype=dtype)
    for row in range(b):
        picks = torch.randperm(n, generator=g)[:4]
        labels[row, picks] = torch.tensor([3.0, 2.0, 1.0, 1.0], dtype=dtype)[: len(picks)]
    return scores, labels


def scipy_w2(x: np.ndarray, y: np.ndarray) -> float:
    cx, cy = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    root = scipy.linalg.sqrtm(cx)
    cross = scipy.linalg.sqrtm(root @ cy @ root)
    return float(np.sum((x.mean(0) - y.mean(0)) ** 2) + np.trace(cx + cy - 2 * np.real(cross)))


@pytest.mark.filterwarnings("ignore::scipy.linalg.LinAlgWarning")
def test_w2_matches_scipy_sqrtm_in_general():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 5, generator=g, dtype=torch.float64)
    mix = torch.randn(5, 5, generator=g, dtype=torch.float64)
    y = torch.randn(9, 5, generator=g, dtype=torch.float64) @ mix
    assert gaussian_w2_from_samples(x, y).item() == pytest.approx(scipy_w2(x.numpy(), y.numpy()), rel=1e-8)
    # more dims than samples (the usual B < N case): singular covariances
    x = torch.randn(4, 10, generator=g, dtype=torch.float64)
    y = torch.randn(4, 10, generator=g, dtype=torch.float64)
    assert gaussian_w2_from_samples(x, y).item() == pytest.approx(scipy_w2(x.numpy(), y.numpy()), rel=1e-6)


def test_w2_diagonal_covariance_closed_form():
    # centred, mutually orthogonal columns -> diagonal covariances
    h = torch.tensor([[1, 1, 1], [-1, 1, -1], [1, -1, -1], [-1, -1, 1]], dtype=torch.float64)
    a = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64)
    b = torch.tensor([1.5, 0.2, 1.0], dtype=torch.float64)
    mu_x = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
    mu_y = torch.tensor([0.0, 1.0, 3.0], dtype=torch.float64)
    x, y = mu_x + h * a, mu_y + h * b
    var_x, var_y = a ** 2 * 4 / 3, b ** 2 * 4 / 3
    closed = ((mu_x - mu_y) ** 2).sum() + ((var_x.sqrt() - var_y.sqrt()) ** 2).sum()
    assert torch.allclose(gaussian_w2_from_samples(x, y), closed, atol=1e-12)


def test_wasserstein_zero_for_identical_and_never_negative():
    scores, labels = graded_case(b=8, n=16, seed=2)
    assert abs(WassersteinLoss()(labels.clone(), labels).item()) < 1e-12
    for seed in range(5):
        s, lab = graded_case(b=8, n=16, seed=seed + 10)
        assert WassersteinLoss()(s * 3, lab).item() >= 0.0
    # the misprinted minus sign would make this negative
    assert WassersteinLoss()(scores, labels).item() > 0.0


def test_wasserstein_loss_is_w2_of_softmaxes_and_gradcheck():
    scores, labels = graded_case(b=5, n=7, seed=3)
    labels[2] = 0.0  # no positive: left out
    loss_fn = WassersteinLoss()
    loss = loss_fn(scores, labels)
    keep = torch.tensor([0, 1, 3, 4])
    expected = scipy_w2(scores[keep].softmax(1).numpy(), labels[keep].softmax(1).numpy())
    assert loss.item() == pytest.approx(expected, rel=1e-8)
    assert loss_fn.last_stats["anchors_without_positive"] == 1
    x = scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: loss_fn(s, labels), (x,))
    assert loss_fn(scores.float(), labels.float()).dtype == torch.float32


def test_kl_and_listnet_match_torch():
    scores, labels = graded_case(seed=4)
    target = labels.softmax(1)
    kl_ref = F.kl_div(scores.log_softmax(1), target, reduction="batchmean")
    assert torch.allclose(KLListLoss()(scores, labels), kl_ref, atol=1e-12)
    ce_ref = -(target * scores.log_softmax(1)).sum(1).mean()
    assert torch.allclose(ListNetLoss()(scores, labels), ce_ref, atol=1e-12)
    assert abs(KLListLoss()(labels.clone(), labels).item()) < 1e-12


def explicit_ranknet(scores, labels):
    rows = []
    for s, y in zip(scores, labels):
        terms = [F.softplus(s[j] - s[i]) for i in range(len(s)) for j in range(len(s)) if y[i] > y[j]]
        rows.append(torch.stack(terms).mean())
    return torch.stack(rows).mean()


def explicit_approx_ndcg(scores, labels, alpha):
    rows = []
    for s, y in zip(scores, labels):
        n = len(s)
        ranks = [1 + sum(torch.sigmoid((s[j] - s[i]) / alpha) for j in range(n) if j != i) for i in range(n)]
        dcg = sum((2 ** y[i] - 1) / math.log2(1 + ranks[i]) for i in range(n))
        ideal = sorted(y.tolist(), reverse=True)
        idcg = sum((2 ** g - 1) / math.log2(2 + r) for r, g in enumerate(ideal))
        rows.append(1 - dcg / idcg)
    return torch.stack(rows).mean()


def test_ranknet_and_approx_ndcg_exact_match_loops():
    scores, labels = graded_case(b=4, n=9, seed=5)
    assert torch.allclose(RankNetLoss()(scores, labels), explicit_ranknet(scores, labels), atol=1e-12)
    assert torch.allclose(ApproxNDCGLoss(alpha=0.5)(scores, labels),
                          explicit_approx_ndcg(scores, labels, 0.5), atol=1e-12)


def test_sampled_pairs_estimate_the_exact_loss():
    scores, labels = graded_case(b=6, n=40, seed=6)
    for cls in (RankNetLoss, ApproxNDCGLoss):
        exact = cls()(scores, labels).item()
        sampled = np.mean([cls(neg_samples=8, seed=s)(scores, labels).item() for s in range(300)])
        assert sampled == pytest.approx(exact, rel=0.02 if cls is RankNetLoss else 0.05), cls.__name__
        assert cls(neg_samples=8, seed=1)(scores, labels) == cls(neg_samples=8, seed=1)(scores, labels)


def test_approx_ndcg_near_zero_for_well_separated_perfect_order():
    labels = torch.tensor([[3.0, 2.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    scores = torch.tensor([[400.0, 300.0, 200.0, 0.0, -50.0]], dtype=torch.float64)
    assert ApproxNDCGLoss()(scores, labels).item() < 1e-8
    assert ApproxNDCGLoss()(-scores, labels).item() > 0.3


@pytest.mark.parametrize("name", GRADED)
def test_graded_gradcheck_padding_and_bad_input(name):
    scores, labels = graded_case(b=3, n=6, seed=7)
    valid = torch.ones_like(labels, dtype=torch.bool)
    valid[0, -1] = valid[2, 0] = False
    loss_fn = get_loss(name)
    x = scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: loss_fn(s, labels, valid), (x,))
    keep = torch.ones(6, dtype=torch.bool)
    keep[0] = False
    valid_cols = keep.expand(3, -1)
    if name != "wasserstein":  # per-anchor losses: padding == dropping the column
        assert torch.allclose(loss_fn(scores, labels, valid_cols), loss_fn(scores[:, keep], labels[:, keep]))
    with pytest.raises(ValueError, match=r"\(3, 5\).*\(3, 6\)"):
        loss_fn(scores, labels[:, :5])
    bad = scores.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match="NaN/inf"):
        loss_fn(bad, labels)
    with pytest.raises(ValueError, match=">= 0"):
        loss_fn(scores, labels - 5)
    empty = loss_fn(x, torch.zeros_like(labels))
    assert empty.item() == 0.0 and loss_fn.last_stats["anchors_without_positive"] == 3


@pytest.mark.parametrize("cls", [RankNetLoss, ApproxNDCGLoss])
def test_default_is_exact_for_small_and_sampled_for_large_candidate_sets(cls):
    from gsdistill.losses.pairwise_graded import AUTO_EXACT_MAX, AUTO_NEG_SAMPLES, resolve_neg_samples
    assert (resolve_neg_samples("auto", AUTO_EXACT_MAX), resolve_neg_samples("auto", AUTO_EXACT_MAX + 1)) == \
        (None, AUTO_NEG_SAMPLES) == (None, 256)
    small, small_labels = graded_case(b=4, n=AUTO_EXACT_MAX, seed=3)
    assert torch.equal(cls(seed=0)(small, small_labels), cls(neg_samples=None)(small, small_labels))
    big, big_labels = graded_case(b=4, n=AUTO_EXACT_MAX + 8, seed=3)
    default = cls(seed=5)(big, big_labels)
    assert torch.equal(default, cls(neg_samples=AUTO_NEG_SAMPLES, seed=5)(big, big_labels))
    assert not torch.equal(default, cls(neg_samples=None)(big, big_labels))
    with pytest.raises(ValueError, match="neg_samples must be an int, None or 'auto'"):
        cls(neg_samples="all")(small, small_labels)
