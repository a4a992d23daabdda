"""Multi-positive contrastive losses over a score matrix (paper 000 eq. 3-9; paper 003 §4.1).

Shapes: ``scores: float[B, N]`` logits (already scaled, see ``LogitScale``) of B anchors against N
candidates; ``positives: bool[B, N]``; ``valid: bool[B, N] | None`` marks real (non-padding)
candidates. Positives are ``positives & valid``, negatives ``valid & ~positives``.

Anchors with no valid positive are excluded from the mean and counted in
``stats["anchors_without_positive"]``. Anchors with positives but no negative stay in: their loss
is the formula with an empty negative sum (0 for SingleLH/SumMargLH/LSEPair, the within-positive
spread for JointLH), counted in ``stats["anchors_without_negative"]``. The returned scalar is the
mean over used anchors (0, still attached to the graph, when no anchor is used).

Speed: one fused ``log_softmax`` (SumMargLH, JointLH) or one ``fast_lse.lse_minus_linear``
(SingleLH, Rand1LH, LSEPair) over ``[B, N]``, plus gathers of the few positives (``masks``): each
costs 1.3-1.9 cross-entropies on the same matrix (``tools/bench/bench_losses.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gsdistill.losses.fast_lse import logsumexp_excluding, lse_minus_linear, positive_mass_nll
from gsdistill.losses.masks import PositiveSet, fill_stats, positive_set, prepare_dense, prepare_masks
from gsdistill.losses.validation import big_negative, check_like, check_scores, checks_enabled, mean_over


def candidate_log_probs(scores: Tensor, valid: Tensor | None) -> Tensor:
    """``log softmax`` over the valid candidates of each row (padding gets about -inf); half
    precision logits are lifted to float32 first (their softmax tail would round away)."""
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    if valid is not None:
        scores = scores.masked_fill(~valid, big_negative(scores.dtype))
    return torch.log_softmax(scores, dim=1)


def _slot_values(values: Tensor, idx: Tensor, ok: Tensor, fill: float) -> Tensor:
    """``values`` gathered at the positive slots, ``fill`` where a slot is padding."""
    return values.gather(1, idx).masked_fill(~ok, fill)


def sum_marg_lh(scores: Tensor, positives: Tensor, valid: Tensor | None = None,
                stats: dict | None = None) -> Tensor:
    """SumMargLH = MPCL: ``-log( sum_{p in P} e^{s_p} / sum_{d in P u N} e^{s_d} )``.

    Paper 000 eq. 7 (gradient eq. 11), paper 003 §4.1 (MPCL). Shapes: see module docstring.
    With checks off (``validation.set_checks``): ``fast_lse.positive_mass_nll``, one dense float64
    softmax instead of gathered slots, the same value with no host sync (no ``nonzero``, no slot
    count read back).
    """
    if not checks_enabled():
        valid, pos, used = prepare_dense("SumMargLH", scores, positives, valid, stats)
        return mean_over(positive_mass_nll(scores, pos, valid, used), used, scores)
    prep = prepare_masks("SumMargLH", scores, positives, valid, stats)
    log_probs = candidate_log_probs(scores, prep.valid)
    slots = _slot_values(log_probs, prep.pset.idx, prep.pset.ok, big_negative(scores.dtype))
    return mean_over(-torch.logsumexp(slots, dim=1), prep.used, scores)


def joint_lh(scores: Tensor, positives: Tensor, valid: Tensor | None = None,
             stats: dict | None = None) -> Tensor:
    """JointLH: ``-(1/|P|) sum_{p in P} log( e^{s_p} / sum_{d in P u N} e^{s_d} )``.

    Paper 000 eq. 6 (gradient eq. 10: ``softmax(s)_p - 1/|P|``). Shapes: see module docstring.
    With checks off: a dense masked sum, the same value with no host sync (as ``sum_marg_lh``).
    """
    if not checks_enabled():
        valid, pos, used = prepare_dense("JointLH", scores, positives, valid, stats)
        log_probs = candidate_log_probs(scores, valid)
        per_anchor = -log_probs.masked_fill(~pos, 0.0).sum(dim=1) / pos.sum(dim=1).clamp(min=1)
        return mean_over(per_anchor, used, scores)
    prep = prepare_masks("JointLH", scores, positives, valid, stats)
    log_probs = candidate_log_probs(scores, prep.valid)
    slots = _slot_values(log_probs, prep.pset.idx, prep.pset.ok, 0.0)
    per_anchor = -slots.sum(dim=1) / prep.pset.count.clamp(min=1)
    return mean_over(per_anchor, prep.used, scores)


def lse_pair(scores: Tensor, positives: Tensor, valid: Tensor | None = None,
             stats: dict | None = None) -> Tensor:
    """LSEPair: ``log(1 + sum_{p in P} sum_{n in N} e^{s_n - s_p})``.

    Paper 000 eq. 9 (gradient eq. 12). The double sum factorises,
    ``sum_p sum_n e^{s_n - s_p} = exp(LSE_n(s) + LSE_p(-s))``, so the loss is
    ``softplus(LSE_n(s) + LSE_p(-s))``: O(B*N), no [B, |P|, |N|] tensor.
    """
    prep = prepare_masks("LSEPair", scores, positives, valid, stats)
    lse_neg = logsumexp_excluding(scores, prep.pset.rows, prep.pset.cols, prep.valid)
    lse_inv_pos = torch.logsumexp(_slot_values(scores, prep.pset.idx, prep.pset.ok, 0.0).neg()
                                  .masked_fill(~prep.pset.ok, big_negative(scores.dtype)), dim=1)
    return mean_over(F.softplus(lse_neg + lse_inv_pos), prep.used, scores)


def single_positive_nll(name: str, scores: Tensor, chosen: Tensor, positives: Tensor | None,
                        valid: Tensor | None, exclude_other_positives: bool,
                        stats: dict | None, pset: PositiveSet | None = None) -> Tensor:
    """InfoNCE of one chosen positive per row (``chosen: long[B]``, negative index = none).

    ``-log( e^{s_c} / (e^{s_c} + sum_{n in N} e^{s_n}) )`` (paper 000 eq. 3/5/8). With
    ``exclude_other_positives`` the unchosen positives are left out of the denominator (eq. 5, and the
    SP loss of paper 003 Lemma 5); otherwise every valid candidate is in it (plain cross-entropy).
    A chosen index that is negative or points at padding leaves the anchor out (counted).
    """
    check_scores(name, scores)
    batch, n_cand = scores.shape
    if chosen.shape != (batch,):
        raise ValueError(f"{name}: positive_index shape {tuple(chosen.shape)} does not match "
                         f"scores rows ({batch},) of scores shape {tuple(scores.shape)}")
    if checks_enabled() and bool((chosen >= n_cand).any()):
        raise ValueError(f"{name}: positive_index has values >= N={n_cand}")
    valid = check_like(name, "valid", scores, valid, "bool")
    chosen = chosen.to(scores.device)
    target = chosen.clamp(min=0)
    used = chosen >= 0
    if valid is not None:
        used = used & valid.gather(1, target[:, None])[:, 0]
    n_valid = valid.sum(dim=1) if valid is not None else torch.full_like(target, n_cand)
    n_others = torch.zeros_like(target)
    skip_rows = skip_cols = target[:0]
    if positives is not None and exclude_other_positives:
        positives = check_like(name, "positives", scores, positives, "bool")
        if pset is None:
            pset = positive_set(positives if valid is None else positives & valid)
        others = pset.ok & (pset.idx != target[:, None])
        skip_rows = torch.arange(batch, device=scores.device)[:, None].expand_as(others)[others]
        skip_cols = pset.idx[others]
        n_others = others.sum(dim=1)
    if stats is not None:
        fill_stats(stats, used, used.long(), n_valid - 1 - n_others)
    anchors = torch.arange(batch, device=scores.device)
    per_anchor = lse_minus_linear(scores, skip_rows, skip_cols, valid, anchors, target,
                                  torch.ones_like(scores[:, 0]))
    return mean_over(per_anchor, used, scores)


def _valid_positive_set(name: str, scores: Tensor, positives: Tensor, valid: Tensor | None) -> PositiveSet:
    check_scores(name, scores)
    if positives is None:
        raise ValueError(f"{name}: positives mask is required")
    positives = check_like(name, "positives", scores, positives, "bool")
    valid = check_like(name, "valid", scores, valid, "bool")
    return positive_set(positives if valid is None else positives & valid)


def first_positive_index(positives: Tensor, pset: PositiveSet | None = None) -> Tensor:
    """Index of the first True per row (-1 where the row has none); ``long[B]``."""
    pset = positive_set(positives) if pset is None else pset
    return torch.where(pset.count > 0, pset.idx[:, 0], torch.full_like(pset.count, -1))


def random_positive_index(positives: Tensor, generator: torch.Generator | None = None,
                          pset: PositiveSet | None = None) -> Tensor:
    """One uniformly drawn positive per row (-1 where none); draws on the generator's device."""
    pset = positive_set(positives) if pset is None else pset
    device = generator.device if generator is not None else pset.idx.device
    noise = torch.rand(pset.idx.shape, generator=generator, device=device).to(pset.idx.device)
    slot = torch.where(pset.ok, noise + 1.0, torch.zeros_like(noise)).argmax(dim=1, keepdim=True)
    return torch.where(pset.count > 0, pset.idx.gather(1, slot)[:, 0], torch.full_like(pset.count, -1))


class MultiPositiveLoss(nn.Module):
    """Base: keeps ``last_stats`` (anchors used / without positive / without negative)."""

    def __init__(self) -> None:
        super().__init__()
        self.last_stats: dict = {}


class SumMargLH(MultiPositiveLoss):
    """Summed marginal likelihood = MPCL (see ``sum_marg_lh``). forward(scores, positives, valid)."""

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return sum_marg_lh(scores, positives, valid, stats=self.last_stats)


class JointLH(MultiPositiveLoss):
    """Joint likelihood of all positives (see ``joint_lh``). forward(scores, positives, valid)."""

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return joint_lh(scores, positives, valid, stats=self.last_stats)


class LSEPair(MultiPositiveLoss):
    """Log-sum-exp pairwise loss (see ``lse_pair``). forward(scores, positives, valid)."""

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return lse_pair(scores, positives, valid, stats=self.last_stats)


class SingleLH(MultiPositiveLoss):
    """SingleLH / InfoNCE (paper 000 eq. 3): the first positive of each row, or ``positive_index``.

    forward(scores [B,N], positives bool[B,N] | None, valid=None, positive_index long[B] | None).
    With only ``positive_index`` it is ``F.cross_entropy`` over the valid candidates; with a
    ``positives`` mask the other positives leave the denominator (``exclude_other_positives``).
    """

    def __init__(self, exclude_other_positives: bool = True) -> None:
        super().__init__()
        self.exclude_other_positives = exclude_other_positives

    def forward(self, scores: Tensor, positives: Tensor | None = None, valid: Tensor | None = None,
                positive_index: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        pset = None
        if positive_index is None:
            pset = _valid_positive_set("SingleLH", scores, positives, valid)
            positive_index = first_positive_index(positives, pset)
        return single_positive_nll("SingleLH", scores, positive_index, positives, valid,
                                   self.exclude_other_positives, self.last_stats, pset)


class Rand1LH(MultiPositiveLoss):
    """Rand1LH (paper 000 eq. 5): InfoNCE of one uniformly drawn positive per row.

    ``Rand1LH(seed=None, exclude_other_positives=True)``; forward(scores, positives, valid=None,
    generator=None) draws from ``generator`` if given, else from the module's own seeded generator
    (on the CPU, so runs are reproducible across devices), else from torch's global RNG. The
    drawn indices are kept in ``last_chosen``.
    """

    def __init__(self, seed: int | None = None, exclude_other_positives: bool = True) -> None:
        super().__init__()
        self.exclude_other_positives = exclude_other_positives
        self.generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        self.last_chosen: Tensor | None = None

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None,
                generator: torch.Generator | None = None) -> Tensor:
        self.last_stats = {}
        pset = _valid_positive_set("Rand1LH", scores, positives, valid)
        gen = generator if generator is not None else self.generator
        self.last_chosen = random_positive_index(positives, gen, pset)
        return single_positive_nll("Rand1LH", scores, self.last_chosen, positives, valid,
                                   self.exclude_other_positives, self.last_stats, pset)


InfoNCE = SingleLH
MPCL = SumMargLH
