"""Noisy-label losses (paper 004): ambiguity sets, optimistic superset loss, robust baselines."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gsdistill.losses import (
    AGCELoss, AULLoss, EvidenceLabelSmoothingLoss, GCELoss, LabelRelaxationLoss, LabelSmoothingLoss,
    NCEAGCELoss, NCEAULLoss, NCELoss, SupersetPairwiseLoss, ambiguity_sets, get_loss, possibility_distribution,
)
from gsdistill.losses.robust import reciprocal_jaccard

NOISY = ["superset_pairwise", "gce", "nce", "agce", "aul", "label_smoothing", "label_relaxation", "nce_agce",
         "nce_aul"]
# candidate-candidate similarities for ELS: docs {0, 1} and {2, 3} are reciprocal 2-NN pairs
DOC_SIM = [[1.0, 0.8, 0.1, 0.3], [0.8, 1.0, 0.2, 0.1], [0.1, 0.2, 1.0, 0.9], [0.3, 0.1, 0.9, 1.0]]


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


def _log_softmax(row):
    z = math.log(sum(math.exp(v) for v in row))
    return [v - z for v in row]


def test_nce_agce_and_nce_aul_hand_computed():
    scores = torch.tensor([[2.0, 0.0, -1.0]], dtype=torch.float64)
    positives = torch.tensor([[True, False, False]])
    logp = _log_softmax([2.0, 0.0, -1.0])
    p0 = math.exp(logp[0])
    nce = -logp[0] / -sum(logp)
    agce = (2.0 ** 2 - (1.0 + p0) ** 2) / 2.0  # a = 1, q = 2
    aul = ((1.5 - p0) ** 0.9 - 0.5 ** 0.9) / 0.9  # a = 1.5, q = 0.9
    assert NCEAGCELoss()(scores, positives).item() == pytest.approx(nce + agce, abs=1e-12)
    assert NCEAULLoss()(scores, positives).item() == pytest.approx(nce + aul, abs=1e-12)
    assert NCEAGCELoss(alpha=2.0, beta=0.5)(scores, positives).item() == pytest.approx(2 * nce + 0.5 * agce)
    assert get_loss("nce_aul", alpha=0.0, beta=1.0)(scores, positives).item() == pytest.approx(aul)
    with pytest.raises(ValueError, match="alpha"):
        NCEAGCELoss(alpha=0.0, beta=0.0)


def test_reciprocal_jaccard_hand_computed():
    j = reciprocal_jaccard(torch.tensor(DOC_SIM), k=2)
    # R(0) = R(1) = {0, 1}, R(2) = R(3) = {2, 3}
    assert j.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    # k = 3: kNN(0) = {0,1,3}, kNN(1) = {1,0,2}, kNN(2) = {2,3,1}, kNN(3) = {3,2,0}
    # R(0) = {0,1,3}, R(1) = {0,1,2}, R(2) = {1,2,3}, R(3) = {0,2,3}; J(0,1) = |{0,1}| / |{0,1,2,3}|
    j3 = reciprocal_jaccard(torch.tensor(DOC_SIM), k=3)
    assert j3[0, 1].item() == pytest.approx(0.5) and j3[0, 0].item() == 1.0


def test_els_hand_computed():
    scores = torch.tensor([[1.0, 0.5, 0.0, -0.5], [0.2, -0.3, 0.4, 0.0]], dtype=torch.float64)
    positives = torch.tensor([[True, False, False, False], [True, False, True, False]])
    eps, lam = 0.1, 0.5
    # evidence E[d, p] = (1 - lam) S[d, p] + lam J[d, p] with J from k = 2 (see above)
    # anchor 0 (positive 0): E[1,0] = .4 + .5 = .9, E[2,0] = .05, E[3,0] = .15; total 1.1
    t0 = [1 - eps, eps * 0.9 / 1.1, eps * 0.05 / 1.1, eps * 0.15 / 1.1]
    # anchor 1 (positives 0, 2): d=1: max(.9, .1) = .9; d=3: max(.15, .45 + .5) = .95; total 1.85
    t1 = [(1 - eps) / 2, eps * 0.9 / 1.85, (1 - eps) / 2, eps * 0.95 / 1.85]
    expected = 0.0
    for row, t in zip(scores.tolist(), (t0, t1)):
        expected += -sum(ti * lp for ti, lp in zip(t, _log_softmax(row))) / 2
    loss_fn = EvidenceLabelSmoothingLoss(epsilon=eps, lam=lam, k=2)
    sim = torch.tensor(DOC_SIM, dtype=torch.float64)
    assert loss_fn(scores, positives, doc_sim=sim).item() == pytest.approx(expected, abs=1e-12)
    # no evidence anywhere (all similarities <= 0, k = 1 so no shared neighbours): plain CE
    far = -torch.ones(4, 4, dtype=torch.float64) + 2 * torch.eye(4, dtype=torch.float64)
    ce = -_log_softmax(scores[0].tolist())[0]
    assert loss_fn(scores[:1], positives[:1], doc_sim=far).item() == pytest.approx(ce, abs=1e-12)
    x = scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: loss_fn(s, positives, doc_sim=sim), (x,))
    with pytest.raises(ValueError, match="doc_sim"):
        loss_fn(scores, positives)
    assert get_loss("els").needs_doc_similarity
