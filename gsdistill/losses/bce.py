"""DPR+ multi-positive binary cross-entropy (paper 001 eq. 3)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gsdistill.losses.masks import prepare_masks
from gsdistill.losses.multi_positive import MultiPositiveLoss
from gsdistill.losses.validation import mean_over


def multi_positive_bce(scores: Tensor, positives: Tensor, valid: Tensor | None = None,
                       stats: dict | None = None) -> Tensor:
    """``-sum_{p in P} log sigma(s_p) - sum_{n in N} log(1 - sigma(s_n))`` per anchor, mean over anchors.

    Paper 001 eq. 3 (sum over the anchor's positives and negatives, not a mean). Written as
    ``softplus(-s_p)`` and ``softplus(s_n)`` for stability. ``scores: float[B, N]`` logits,
    ``positives: bool[B, N]``, ``valid: bool[B, N] | None``. Anchors without a positive are
    excluded and counted, like every multi-positive loss.
    """
    prep = prepare_masks("MultiPositiveBCE", scores, positives, valid, stats)
    # -log(1 - sigma(s)) = softplus(s) and -log sigma(s) = softplus(s) - s: sum softplus over the
    # valid candidates, then subtract the positives' scores (gathered, no [B, N] mask pass)
    per_candidate = F.softplus(scores)
    if prep.valid is not None:
        per_candidate = torch.where(prep.valid, per_candidate, torch.zeros_like(per_candidate))
    pos_scores = scores.gather(1, prep.pset.idx).masked_fill(~prep.pset.ok, 0.0)
    per_anchor = per_candidate.sum(dim=1) - pos_scores.sum(dim=1)
    return mean_over(per_anchor, prep.used, scores)


class MultiPositiveBCE(MultiPositiveLoss):
    """DPR+ loss (see ``multi_positive_bce``). forward(scores, positives, valid=None)."""

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return multi_positive_bce(scores, positives, valid, stats=self.last_stats)
