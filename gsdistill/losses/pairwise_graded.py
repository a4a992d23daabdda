"""Pairwise graded losses: RankNet and ApproxNDCG (paper 002 Table 3 baselines).

Both need, for every positive i (grade > 0), a sum over candidates j. Candidates of grade 0 are
the vast majority (in-batch documents), so j is split in two parts:
- positives j: exact, an ``[B, P, P]`` tensor (P = most positives of any row, e.g. 8);
- grade-0 candidates: all of them (``neg_samples=None``, exact, one ``[#positives, N]`` tensor:
  one row per real positive, so rows with few positives cost nothing extra), or ``neg_samples=k``
  drawn uniformly with replacement per anchor (``[#positives, k]``), their sum rescaled by
  ``#grade-0 / #drawn`` -- an unbiased estimate of the exact sum, O(#positives * k) instead of
  O(#positives * N) time and memory. Tests check the exact mode against explicit double loops
  and the sampled mode's mean against the exact value.

Default ``neg_samples="auto"``: exact up to ``AUTO_EXACT_MAX = 512`` candidates per anchor,
``AUTO_NEG_SAMPLES = 256`` sampled grade-0 candidates above. Why: the exact loss has one term per
(positive, candidate) pair, so its cost grows with the pair count -- quadratic in the candidate
list when positives grow with it, and #positives x N transcendental calls even with few
positives: no factorisation exists for ``softplus`` / ``sigmoid`` of pair differences, unlike
LSEPair's exponentials. At 256 anchors x 4,096 candidates with <= 8 positives the exact mode
costs ~21x a cross-entropy, 256 samples ~2.5x (``tools/bench/bench_losses.py``, docs/benchmarks.md).
Pass ``neg_samples=None`` for the exact loss at any size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gsdistill.losses.graded_common import GradedLoss, make_generator, prepare_graded
from gsdistill.losses.validation import big_negative, mean_over

AUTO_EXACT_MAX = 512  # candidates per anchor up to which neg_samples="auto" sums every pair
AUTO_NEG_SAMPLES = 256  # grade-0 candidates drawn per anchor above that


def resolve_neg_samples(neg_samples: int | str | None, n_cand: int) -> int | None:
    """``"auto"`` -> None (exact) for ``n_cand <= AUTO_EXACT_MAX``, else ``AUTO_NEG_SAMPLES``;
    an int or None is returned as given."""
    if neg_samples == "auto":
        return None if n_cand <= AUTO_EXACT_MAX else AUTO_NEG_SAMPLES
    if isinstance(neg_samples, str):
        raise ValueError(f"neg_samples must be an int, None or 'auto', got {neg_samples!r}")
    return neg_samples


def _split(name, scores, labels, valid, stats, neg_samples, generator):
    """Positive slots (scores, grades; padding slots get a huge score so their terms vanish), the
    grade-0 scores ``[B, J]`` (all N, or ``neg_samples`` drawn; entries that are not grade-0
    candidates get a huge negative score so their pair terms are exactly 0), the weight that
    turns a sampled sum into an estimate of the full one, and the number of grade-0 candidates."""
    valid, labels, pset, n_valid, used = prepare_graded(name, scores, labels, valid, stats)
    neg_samples = resolve_neg_samples(neg_samples, scores.shape[1])
    n_slots = pset.idx.shape[1]
    n_zero = n_valid - pset.count  # grades are >= 0: every other valid candidate has grade 0
    neg_fill = big_negative(scores.dtype)
    if neg_samples is None:
        not_zero = labels > 0 if valid is None else (labels > 0) | ~valid
        s_zero, weight = scores.masked_fill(not_zero, neg_fill), torch.ones_like(scores[:, :1])
        s_pos = scores.gather(1, pset.idx)
    else:
        device = generator.device if generator is not None else scores.device
        drawn = torch.randint(0, scores.shape[1], (scores.shape[0], int(neg_samples)),
                              generator=generator, device=device).to(scores.device)
        ok = labels.gather(1, drawn) == 0
        if valid is not None:
            ok &= valid.gather(1, drawn)
        weight = (n_zero[:, None] / ok.sum(dim=1, keepdim=True).clamp(min=1)).to(scores.dtype)
        both = scores.gather(1, torch.cat([pset.idx, drawn], dim=1))  # one gather: one scatter back
        s_pos, s_zero = both[:, :n_slots], both[:, n_slots:].masked_fill(~ok, neg_fill)
    s_pos = s_pos.masked_fill(~pset.ok, -neg_fill)
    y_pos = labels.gather(1, pset.idx).masked_fill(~pset.ok, 0.0)
    return used, n_zero, pset, s_pos, y_pos, s_zero, weight


def ranknet_loss(scores: Tensor, labels: Tensor, valid: Tensor | None = None,
                 neg_samples: int | str | None = "auto", generator: torch.Generator | None = None,
                 stats: dict | None = None) -> Tensor:
    """RankNet (Burges et al. 2005): mean over pairs ``y_i > y_j`` of ``log(1 + e^{s_j - s_i})``.

    Per anchor, then mean over anchors with a positive. Shapes ``[B, N]``; ``neg_samples``
    ("auto": exact up to 512 candidates, 256 drawn above; None: exact): see module docstring.
    """
    used, n_zero, pset, s_pos, y_pos, s_zero, weight = _split(
        "RankNetLoss", scores, labels, valid, stats, neg_samples, generator)
    ok = pset.ok
    pos_pairs = ok[:, :, None] & ok[:, None, :] & (y_pos[:, None, :] < y_pos[:, :, None])
    pos_terms = F.softplus(s_pos[:, None, :] - s_pos[:, :, None])
    pos_sum = torch.where(pos_pairs, pos_terms, torch.zeros_like(pos_terms)).sum(dim=(1, 2))
    # one row of grade-0 terms per real positive ([#positives, J], no padding slots); masked
    # grade-0 entries hold -huge, so their softplus terms are exactly 0
    zero_terms = F.softplus(s_zero[pset.rows] - s_pos[ok][:, None]).sum(dim=1)
    zero_sum = torch.zeros_like(scores[:, 0]).index_add(0, pset.rows, zero_terms)
    n_pairs = pos_pairs.sum(dim=(1, 2)) + pset.count * n_zero
    per_anchor = (pos_sum + weight[:, 0] * zero_sum) / n_pairs.clamp(min=1)
    return mean_over(per_anchor, used & (n_pairs > 0), scores)


def approx_ndcg_loss(scores: Tensor, labels: Tensor, valid: Tensor | None = None,
                     alpha: float = 1.0, neg_samples: int | str | None = "auto",
                     generator: torch.Generator | None = None, stats: dict | None = None) -> Tensor:
    """ApproxNDCG (Qin et al. 2010): ``1 - DCG~ / IDCG`` per anchor, mean over anchors.

    Smooth rank ``pi_i = 1 + sum_{j != i} sigmoid((s_j - s_i) / alpha)`` over valid candidates,
    ``DCG~ = sum_i (2^{y_i} - 1) / log2(1 + pi_i)`` (only positives have a gain), IDCG from the
    grades sorted. Shapes ``[B, N]``; ``neg_samples`` ("auto": exact up to 512 candidates, 256
    drawn above; None: exact) as in the module docstring.
    """
    used, _, pset, s_pos, y_pos, s_zero, weight = _split(
        "ApproxNDCGLoss", scores, labels, valid, stats, neg_samples, generator)
    n_slots = s_pos.shape[1]
    not_self = ~torch.eye(n_slots, dtype=torch.bool, device=scores.device)
    pos_pairs = pset.ok[:, :, None] & pset.ok[:, None, :] & not_self
    pos_terms = torch.sigmoid((s_pos[:, None, :] - s_pos[:, :, None]) / alpha)
    above_pos = torch.where(pos_pairs, pos_terms, torch.zeros_like(pos_terms)).sum(dim=2)
    zero_terms = torch.sigmoid((s_zero[pset.rows] - s_pos[pset.ok][:, None]) / alpha).sum(dim=1)
    above_zero = torch.zeros_like(s_pos).masked_scatter(pset.ok, zero_terms)  # row-major = rows order
    smooth_rank = 1.0 + above_pos + weight * above_zero
    gains = torch.exp2(y_pos) - 1.0
    dcg = (gains / torch.log2(1.0 + smooth_rank)).sum(dim=1)
    ideal_discount = torch.log2(torch.arange(2, n_slots + 2, device=scores.device, dtype=scores.dtype))
    idcg = (gains.sort(dim=1, descending=True).values / ideal_discount).sum(dim=1)
    per_anchor = 1.0 - dcg / idcg.clamp(min=torch.finfo(scores.dtype).tiny)
    return mean_over(per_anchor, used, scores)


class RankNetLoss(GradedLoss):
    """RankNet over graded labels (see ``ranknet_loss``). ``RankNetLoss(neg_samples="auto", seed=None)``:
    exact up to 512 candidates, 256 sampled grade-0 candidates above (module docstring)."""

    def __init__(self, neg_samples: int | str | None = "auto", seed: int | None = None) -> None:
        super().__init__()
        self.neg_samples, self.generator = neg_samples, make_generator(seed)

    def forward(self, scores: Tensor, labels: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return ranknet_loss(scores, labels, valid, self.neg_samples, self.generator, self.last_stats)


class ApproxNDCGLoss(GradedLoss):
    """ApproxNDCG (see ``approx_ndcg_loss``). ``ApproxNDCGLoss(alpha=1.0, neg_samples="auto", seed=None)``:
    exact up to 512 candidates, 256 sampled grade-0 candidates above (module docstring)."""

    def __init__(self, alpha: float = 1.0, neg_samples: int | str | None = "auto",
                 seed: int | None = None) -> None:
        super().__init__()
        if alpha <= 0:
            raise ValueError(f"ApproxNDCGLoss: alpha must be > 0, got {alpha}")
        self.alpha, self.neg_samples, self.generator = alpha, neg_samples, make_generator(seed)

    def forward(self, scores: Tensor, labels: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return approx_ndcg_loss(scores, labels, valid, self.alpha, self.neg_samples,
                                self.generator, self.last_stats)
