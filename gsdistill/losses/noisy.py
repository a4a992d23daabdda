"""Label weakening for noisy retrieval labels (paper 004 §3): ambiguated positive sets and the
optimistic superset pairwise loss."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gsdistill.losses.masks import prepare_masks
from gsdistill.losses.multi_positive import MultiPositiveLoss
from gsdistill.losses.validation import check_like, check_scores, masked_log_softmax


def _check_beta_alpha(beta: float, alpha: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"label weakening: beta must be in [0, 1], got {beta}")
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"label weakening: alpha must be in [0, 1), got {alpha}")


@torch.no_grad()
def possibility_distribution(scores: Tensor, positives: Tensor, beta: float, alpha: float,
                             valid: Tensor | None = None) -> Tensor:
    """``pi[b, d] = 1`` if d is annotated relevant or ``p(d | q_b) >= beta``, else ``alpha``
    (paper 004 §3). ``p = softmax`` of ``scores`` over the valid candidates. Shapes ``[B, N]``;
    padding gets 0. Pass the scores of the previous pass over the data for the paper's delayed
    (per-epoch) ambiguity update; nothing here needs or keeps a gradient.
    """
    _check_beta_alpha(beta, alpha)
    check_scores("possibility_distribution", scores)
    positives = check_like("possibility_distribution", "positives", scores, positives, "bool")
    valid = check_like("possibility_distribution", "valid", scores, valid, "bool")
    if valid is None:
        valid = torch.ones_like(positives)
    probs = masked_log_softmax(scores.detach(), valid).exp()
    plausible = (positives | (probs >= beta)) & valid
    pi = torch.where(plausible, torch.ones_like(probs), torch.full_like(probs, alpha))
    return pi.masked_fill(~valid, 0.0)


def ambiguity_sets(scores: Tensor, positives: Tensor, beta: float, alpha: float,
                   valid: Tensor | None = None) -> Tensor:
    """The ambiguated relevant set ``R*_q = R_q u {d : p(d | q) >= beta}`` as ``bool[B, N]``.

    It is the set where the possibility ``pi == 1`` (``possibility_distribution``): every annotated
    positive stays in, confident candidates join. ``alpha`` (the possibility left to the other
    candidates) is checked to lie in [0, 1) but does not change membership. Paper 004 §3.
    """
    return possibility_distribution(scores, positives, beta, alpha, valid) >= 1.0


def superset_pairwise_loss(scores: Tensor, candidate_positives: Tensor, valid: Tensor | None = None,
                           margin: float | None = None, negative_reduction: str = "sum",
                           stats: dict | None = None) -> Tensor:
    """Optimistic superset loss ``min_{d+ in R*} sum_{d- in N*} l(s_{d+}, s_{d-})`` (paper 004).

    ``l`` = logistic ``log(1 + e^{s- - s+})`` (``margin=None``) or hinge ``max(0, m - s+ + s-)``.
    Both decrease in ``s+``, so the minimum over d+ is reached at the highest-scoring member of
    R*: the loss is the sum with ``s+ = max_{R*} s`` -- exact, O(B*N), and its gradient (through
    that max) is the subgradient of the min. ``negative_reduction``: "sum" (the paper) or "mean".
    Shapes ``scores: [B, N]``, ``candidate_positives: bool[B, N]`` (R*, e.g. from
    ``ambiguity_sets``), ``valid: bool[B, N] | None``; N* = valid candidates outside R*.
    """
    if negative_reduction not in ("sum", "mean"):
        raise ValueError(f"SupersetPairwiseLoss: negative_reduction must be 'sum' or 'mean', got "
                         f"{negative_reduction!r}")
    prep = prepare_masks("SupersetPairwiseLoss", scores, candidate_positives, valid, stats)
    slot_scores = scores.detach().gather(1, prep.pset.idx).masked_fill(~prep.pset.ok, -torch.inf)
    best_index = prep.pset.idx.gather(1, slot_scores.argmax(dim=1, keepdim=True))[:, 0]
    weights = prep.used.to(scores.dtype) / max(int(prep.used.sum()), 1)
    if negative_reduction == "mean":
        weights = weights / (prep.n_valid - prep.pset.count).clamp(min=1)
    return _SupersetPairwise.apply(scores, best_index, prep.pset.rows, prep.pset.cols, prep.valid,
                                   weights, margin)


class _SupersetPairwise(torch.autograd.Function):
    """``sum_b w_b sum_{n in N*_b} l(s_bn - s_b,best)`` with its gradient written out:
    ``w_b l'(gap)`` for the negatives, minus their row sum for the best member of R*. The forward
    keeps only the gaps; the backward turns them into slopes in place. Autograd's graph for the
    same formula (softplus, subtraction of a gathered max, masks) walks ``[B, N]`` about twice as
    often."""

    @staticmethod
    def forward(ctx, scores, best_index, rows, cols, valid, weights, margin):  # noqa: D102
        x = scores.detach()
        if x.dtype in (torch.float16, torch.bfloat16):  # sums of thousands of terms: float32
            x = x.float()
        gap = x - x.gather(1, best_index[:, None])
        terms = F.softplus(gap) if margin is None else F.relu(gap + margin)
        if valid is not None:
            terms.masked_fill_(~valid, 0.0)
        terms[rows, cols] = 0.0  # members of R* are not negatives
        ctx.save_for_backward(gap, best_index, rows, cols, valid, weights)
        ctx.margin, ctx.in_dtype = margin, scores.dtype
        return (terms.sum(dim=1) * weights.to(x.dtype)).sum().to(scores.dtype)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        gap, best_index, rows, cols, valid, weights = ctx.saved_tensors
        if ctx.margin is None:
            slope = torch.sigmoid(gap)
        else:
            slope = (gap > -ctx.margin).to(gap.dtype)
        slope.mul_((weights.to(gap.dtype) * grad.to(gap.dtype))[:, None])
        if valid is not None:
            slope.masked_fill_(~valid, 0.0)
        slope[rows, cols] = 0.0
        slope.scatter_add_(1, best_index[:, None], -slope.sum(dim=1, keepdim=True))
        return slope.to(ctx.in_dtype), None, None, None, None, None, None


class SupersetPairwiseLoss(MultiPositiveLoss):
    """Label-weakening loss (see ``superset_pairwise_loss``).

    ``SupersetPairwiseLoss(margin=None, negative_reduction="sum")``;
    forward(scores, candidate_positives, valid=None).
    """

    def __init__(self, margin: float | None = None, negative_reduction: str = "sum") -> None:
        super().__init__()
        self.margin, self.negative_reduction = margin, negative_reduction

    def forward(self, scores: Tensor, candidate_positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return superset_pairwise_loss(scores, candidate_positives, valid, self.margin,
                                      self.negative_reduction, self.last_stats)
