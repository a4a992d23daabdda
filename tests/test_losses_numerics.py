"""Fast paths against plain references: masked log-sum-exp fallback, sparse-target list-wise
losses, mask decoding, and the registry as a whole."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gsdistill.losses import LOSS_KIND, LOSSES, KLListLoss, ListNetLoss, LSEPair, SingleLH, get_loss
from gsdistill.losses.fast_lse import lse_minus_linear
from gsdistill.losses.masks import graded_entries, true_entries


def test_lse_minus_linear_matches_masked_reference_and_gradcheck():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 9, generator=g, dtype=torch.float64, requires_grad=True)
    rows, cols = torch.tensor([0, 0, 2]), torch.tensor([1, 5, 8])
    valid = torch.ones(4, 9, dtype=torch.bool)
    valid[3, :4] = False
    lin_rows, lin_cols = torch.tensor([1, 3]), torch.tensor([2, 6])
    coef = torch.tensor([0.5, 2.0], dtype=torch.float64)
    row_coef = torch.tensor([0.1, 0.0, 0.3, 0.2], dtype=torch.float64)
    out = lse_minus_linear(x, rows, cols, valid, lin_rows, lin_cols, coef, row_coef)
    keep = valid.clone()
    keep[rows, cols] = False
    ref = torch.logsumexp(x.masked_fill(~keep, -torch.inf), dim=1)
    ref = ref - torch.zeros(4, dtype=torch.float64).index_add(0, lin_rows, coef * x[lin_rows, lin_cols])
    ref = ref - row_coef * torch.where(valid, x, 0.0).sum(dim=1)
    assert torch.allclose(out, ref, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda t: lse_minus_linear(t, rows, cols, valid, lin_rows, lin_cols, coef, row_coef), (x,))


def test_excluded_entries_far_above_the_rest_use_the_exact_fallback():
    """Positives 200 logits above every negative: exp(-200) underflows in float32, so the kept
    sum is recomputed with the positives masked first (both losses stay exact)."""
    scores = torch.zeros(2, 8)
    scores[:, 1:] = torch.linspace(-3, 3, 7)
    positives = torch.zeros(2, 8, dtype=torch.bool)
    positives[:, :2] = True
    scores[:, 0] = 200.0
    scores[0, 1] = 190.0
    x32 = scores.clone().requires_grad_(True)
    loss32 = LSEPair()(x32, positives)
    loss32.backward()
    x64 = scores.double().requires_grad_(True)
    neg = torch.logsumexp(x64.masked_fill(positives, -torch.inf), dim=1)
    inv_pos = torch.logsumexp((-x64).masked_fill(~positives, -torch.inf), dim=1)
    ref = F.softplus(neg + inv_pos).mean()
    ref.backward()
    assert torch.isfinite(loss32) and torch.allclose(loss32.double(), ref, rtol=1e-5)
    assert torch.allclose(x32.grad.double(), x64.grad, atol=1e-6)
    single = SingleLH()(scores, positives)  # denominator without the towering second positive
    single_ref = torch.logsumexp(scores[:, [0, 2, 3, 4, 5, 6, 7]].double(), dim=1) - scores[:, 0].double()
    assert torch.allclose(single.double(), single_ref.mean(), atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sparse_target_listwise_is_exact_even_without_grade_zero(temperature):
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(3, 6, generator=g, dtype=torch.float64)
    labels = torch.tensor([[3.0, 2.0, 1.0, 1.0, 2.0, 3.0],   # no grade-0 candidate at all
                           [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],
                           [0.5, 0.0, 0.0, 2.5, 0.0, 0.0]], dtype=torch.float64)
    target = (labels / temperature).softmax(dim=1)
    ref_ce = -(target * scores.log_softmax(dim=1)).sum(dim=1).mean()
    ref_kl = F.kl_div(scores.log_softmax(dim=1), target, reduction="batchmean")
    assert torch.allclose(ListNetLoss(temperature)(scores, labels), ref_ce, atol=1e-12)
    assert torch.allclose(KLListLoss(temperature)(scores, labels), ref_kl, atol=1e-12)


def test_true_entries_equals_nonzero_for_any_layout():
    g = torch.Generator().manual_seed(2)
    for shape in [(5, 16), (3, 7), (4, 64)]:
        mask = torch.rand(shape, generator=g) < 0.3
        for view in (mask, mask[1:], mask[:, 1:]):
            rows, cols = true_entries(view)
            ref_rows, ref_cols = view.nonzero(as_tuple=True)
            assert torch.equal(rows, ref_rows) and torch.equal(cols, ref_cols)


def test_graded_entries_equal_positive_grades_including_negative_zero():
    g = torch.Generator().manual_seed(3)
    for dtype, n in [(torch.float32, 16), (torch.float64, 10), (torch.float32, 7), (torch.float16, 8)]:
        levels = torch.randint(1, 4, (4, n), generator=g).to(dtype)
        grades = (torch.rand(4, n, generator=g) < 0.3).to(dtype) * levels
        grades[0, 0] = -0.0
        for view in (grades, grades[1:]):
            rows, cols = graded_entries(view)
            ref_rows, ref_cols = (view > 0).nonzero(as_tuple=True)
            assert torch.equal(rows, ref_rows) and torch.equal(cols, ref_cols)


def test_registry_builds_every_listed_loss():
    expected = {"single_lh", "infonce", "rand1_lh", "joint_lh", "sum_marg_lh", "mpcl", "lse_pair", "bce",
                "wasserstein", "kl", "listnet", "ranknet", "approx_ndcg", "superset_pairwise", "gce", "nce",
                "agce", "aul", "label_smoothing", "label_relaxation", "els", "nce_agce", "nce_aul", "dino", "ibot", "koleo", "koleo_hybrid",
                "patch_spread"}
    assert set(LOSSES) == expected == set(LOSS_KIND)
    assert set(LOSS_KIND.values()) == {"multi_positive", "graded", "noisy", "distill", "reg"}
    for name in expected:
        kwargs = {"out_dim": 8} if LOSS_KIND[name] == "distill" else {}
        assert isinstance(get_loss(name, **kwargs), torch.nn.Module)


def test_empty_batch_gives_zero_and_no_candidates_is_an_error():
    for name, kind in LOSS_KIND.items():
        if kind in ("distill", "reg"):
            continue
        loss_fn = get_loss(name)
        target = torch.zeros(0, 8) if kind == "graded" else torch.zeros(0, 8, dtype=torch.bool)
        empty = torch.zeros(0, 8, requires_grad=True)
        value = loss_fn(empty, target)
        value.backward()
        assert value.item() == 0.0, name
        bad = torch.zeros(2, 0) if kind == "graded" else torch.zeros(2, 0, dtype=torch.bool)
        with pytest.raises(ValueError, match="no candidates"):
            loss_fn(torch.zeros(2, 0), bad)
