"""Noisy-label losses (paper 004): ambiguity sets, optimistic superset loss, robust baselines."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gsdistill.losses import (
    AGCELoss, AULLoss, GCELoss, LabelRelaxationLoss, LabelSmoothingLoss, NCELoss, SupersetPairwiseLoss,
    ambiguity_sets, get_loss, possibility_distribution,
)

NOISY = ["superset_pairwise", "gce", "nce", "agce", "aul", "label_smoothing", "label_relaxation"]


def one_positive_case(b=6, n=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g, dtype=torch.float64) * 2
    target = torch.randint(0, n, (b,), generator=g)
    return scores, target, F.one_hot(target, n).bool()


def test_ambiguity_sets_hand_made():
    scores = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.45, 0.35]], dtype=torch.float64))
    positives = torch.tensor([[False, False, True], [True, False, False]])
    sets = ambiguity_sets(scores, positives, beta=0.4, alpha=0.2)
    assert sets.tolist() == [[True, False, True], [True, True, False]]
    pi = possibility_distribution(scores, positives, beta=0.4, alpha=0.2)
    assert torch.allclose(pi, torch.tensor([[1.0, 0.2, 1.0], [1.0, 1.0, 0.2]], dtype=torch.float64))
    valid = torch.tensor([[True, True, True], [True, True, False]])  # renormalised: 0.2/0.65, 0.45/0.65
    expected = [[True, False, True], [True, True, False]]
    assert ambiguity_sets(scores, positives, 0.6, 0.2, valid).tolist() == expected
    assert ambiguity_sets(scores, positives, 1.0, 0.0).equal(positives)  # beta=1: annotations only
    with pytest.raises(ValueError, match="alpha"):
        ambiguity_sets(scores, positives, 0.5, 1.0)
    with pytest.raises(ValueError, match="beta"):
        ambiguity_sets(scores, positives, 1.5, 0.1)


def brute_force_superset(scores, sets, margin=None):
    rows = []
    for s, r in zip(scores, sets):
        sums = []
        for p in r.nonzero().flatten():
            gap = s[~r] - s[p]
            sums.append((F.softplus(gap) if margin is None else F.relu(margin + gap)).sum())
        rows.append(torch.stack(sums).min())
    return torch.stack(rows).mean()


def test_superset_loss_is_min_over_plausible_positives():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(5, 10, generator=g, dtype=torch.float64)
    sets = torch.rand(5, 10, generator=g) < 0.3
    sets[:, 0] = True
    for margin in (None, 0.5):
        loss = SupersetPairwiseLoss(margin=margin)(scores, sets)
        assert torch.allclose(loss, brute_force_superset(scores, sets, margin), atol=1e-12)
    mean_version = SupersetPairwiseLoss(negative_reduction="mean")(scores[:1], sets[:1])
    assert torch.allclose(mean_version, brute_force_superset(scores[:1], sets[:1]) / (~sets[0]).sum())
    # with a single positive it is the plain logistic pairwise loss
    one = torch.zeros_like(sets)
    one[:, 3] = True
    assert torch.allclose(SupersetPairwiseLoss()(scores, one), brute_force_superset(scores, one))


def test_robust_losses_one_positive_reference_formulas():
    scores, target, positives = one_positive_case()
    p = scores.softmax(1).gather(1, target[:, None])[:, 0]
    log_p = scores.log_softmax(1)
    refs = {
        GCELoss(q=0.7): (1 - p ** 0.7) / 0.7,
        NCELoss(): -log_p.gather(1, target[:, None])[:, 0] / (-log_p).sum(1),
        AGCELoss(a=1.0, q=2.0): (2.0 ** 2 - (1 + p) ** 2) / 2,
        AULLoss(a=1.5, q=0.9): ((1.5 - p) ** 0.9 - 0.5 ** 0.9) / 0.9,
    }
    for loss_fn, ref in refs.items():
        assert torch.allclose(loss_fn(scores, positives), ref.mean(), atol=1e-12), type(loss_fn).__name__
    ls = LabelSmoothingLoss(0.1)(scores, positives)
    assert torch.allclose(ls, F.cross_entropy(scores, target, label_smoothing=0.1), atol=1e-12)


def test_label_relaxation_reference():
    scores, target, positives = one_positive_case(seed=2)
    alpha = 0.1
    probs = scores.softmax(1)
    p_y = probs.gather(1, target[:, None])
    relaxed = torch.where(positives, torch.full_like(probs, 1 - alpha), alpha * probs / (1 - p_y))
    kl = (relaxed * (relaxed.log() - probs.log())).sum(1)
    expected = torch.where(p_y[:, 0] >= 1 - alpha, torch.zeros_like(kl), kl).mean()
    assert torch.allclose(LabelRelaxationLoss(alpha)(scores, positives), expected, atol=1e-12)
    confident = scores.clone()
    confident[torch.arange(6), target] = 50.0
    assert LabelRelaxationLoss(alpha)(confident, positives).item() == 0.0


@pytest.mark.parametrize("name", NOISY)
def test_noisy_gradcheck_exclusion_and_bad_input(name):
    scores, _, positives = one_positive_case(b=4, n=6, seed=3)
    positives[0, 5] = True
    positives[3] = False
    valid = torch.ones_like(positives)
    valid[1, 0] = False
    loss_fn = get_loss(name)
    x = scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: loss_fn(s, positives, valid), (x,))
    assert loss_fn.last_stats["anchors_without_positive"] == 1
    assert loss_fn.last_stats["anchors_used"] == 3
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(4, 6\)"):
        loss_fn(scores, positives[:, :5])
    bad = scores.clone()
    bad[2, 2] = math.inf
    with pytest.raises(ValueError, match="NaN/inf"):
        loss_fn(bad, positives)
