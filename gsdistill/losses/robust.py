"""Noise-robust classification losses over candidates, the baselines of paper 004 (Table 1).

Each treats an anchor's candidates as classes and its positive set as the label: with
``log p_P = LSE_P(s) - LSE_valid(s)`` (probability mass on the positives), one positive gives the
published single-label form exactly. forward(scores [B, N], positives bool[B, N], valid=None);
anchors without a positive are excluded and counted (``last_stats``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gsdistill.losses.masks import prepare_masks
from gsdistill.losses.multi_positive import MultiPositiveLoss
from gsdistill.losses.multi_positive import candidate_log_probs
from gsdistill.losses.validation import big_negative, mean_over


def _log_p_pos(name: str, scores, positives, valid, stats):
    """``(prepared masks, log_probs [B, N], log p_P [B])`` (0 for anchors without a positive)."""
    prep = prepare_masks(name, scores, positives, valid, stats)
    log_probs = candidate_log_probs(scores, prep.valid)
    slots = log_probs.gather(1, prep.pset.idx).masked_fill(~prep.pset.ok, big_negative(scores.dtype))
    log_p_pos = torch.logsumexp(slots, dim=1)
    return prep, log_probs, torch.where(prep.used, log_p_pos, torch.zeros_like(log_p_pos))


class GCELoss(MultiPositiveLoss):
    """Generalized cross-entropy (Zhang & Sabuncu 2018): ``(1 - p_P^q) / q``, q in (0, 1]."""

    def __init__(self, q: float = 0.7) -> None:
        super().__init__()
        if not 0.0 < q <= 1.0:
            raise ValueError(f"GCELoss: q must be in (0, 1], got {q}")
        self.q = q

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, _, log_p = _log_p_pos("GCELoss", scores, positives, valid, self.last_stats)
        return mean_over((1.0 - torch.exp(self.q * log_p)) / self.q, prep.used, scores)


class NCELoss(MultiPositiveLoss):
    """Normalized cross-entropy (Ma et al. 2020): ``-log p_P / sum_{d valid} -log p_d``."""

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, log_probs, log_p = _log_p_pos("NCELoss", scores, positives, valid, self.last_stats)
        if prep.valid is not None:
            log_probs = torch.where(prep.valid, log_probs, torch.zeros_like(log_probs))
        denom = -log_probs.sum(dim=1)
        return mean_over(-log_p / denom.clamp(min=torch.finfo(scores.dtype).tiny), prep.used, scores)


class AGCELoss(MultiPositiveLoss):
    """Asymmetric GCE (Zhou et al. 2021): ``((a + 1)^q - (a + p_P)^q) / q``; defaults a=1, q=2."""

    def __init__(self, a: float = 1.0, q: float = 2.0) -> None:
        super().__init__()
        if a <= 0 or q <= 0:
            raise ValueError(f"AGCELoss: need a > 0 and q > 0, got a={a}, q={q}")
        self.a, self.q = a, q

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, _, log_p = _log_p_pos("AGCELoss", scores, positives, valid, self.last_stats)
        per_anchor = ((self.a + 1) ** self.q - (self.a + log_p.exp()) ** self.q) / self.q
        return mean_over(per_anchor, prep.used, scores)


class AULLoss(MultiPositiveLoss):
    """Asymmetric unhinged loss (Zhou et al. 2021): ``((a - p_P)^q - (a - 1)^q) / q``; a=1.5, q=0.9."""

    def __init__(self, a: float = 1.5, q: float = 0.9) -> None:
        super().__init__()
        if a <= 1 or q <= 0:
            raise ValueError(f"AULLoss: need a > 1 and q > 0, got a={a}, q={q}")
        self.a, self.q = a, q

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, _, log_p = _log_p_pos("AULLoss", scores, positives, valid, self.last_stats)
        per_anchor = ((self.a - log_p.exp()) ** self.q - (self.a - 1) ** self.q) / self.q
        return mean_over(per_anchor, prep.used, scores)


class LabelSmoothingLoss(MultiPositiveLoss):
    """Label smoothing (Szegedy et al. 2016): cross-entropy against ``(1 - eps) u_P + eps u_valid``
    (u = uniform over the positives / over the valid candidates); eps=0.1."""

    def __init__(self, epsilon: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= epsilon < 1.0:
            raise ValueError(f"LabelSmoothingLoss: epsilon must be in [0, 1), got {epsilon}")
        self.epsilon = epsilon

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, log_probs, _ = _log_p_pos("LabelSmoothingLoss", scores, positives, valid,
                                        self.last_stats)
        # CE against the mixture = (1 - eps) * mean over positives + eps * mean over valid
        pos_part = log_probs.gather(1, prep.pset.idx).masked_fill(~prep.pset.ok, 0.0).sum(dim=1)
        if prep.valid is not None:
            log_probs = torch.where(prep.valid, log_probs, torch.zeros_like(log_probs))
        per_anchor = -((1 - self.epsilon) * pos_part / prep.pset.count.clamp(min=1)
                       + self.epsilon * log_probs.sum(dim=1) / prep.n_valid.clamp(min=1))
        return mean_over(per_anchor, prep.used, scores)


class LabelRelaxationLoss(MultiPositiveLoss):
    """Label relaxation (Lienen & Huellermeier 2021), the credal-set baseline of paper 004.

    Zero when ``p_P >= 1 - alpha``; otherwise ``KL(r || p)`` with the projection ``r`` of ``p`` onto
    the credal set: ``r_d = (1 - alpha) p_d / p_P`` on positives, ``alpha p_d / (1 - p_P)`` on the
    others (r computed without gradient, as in the reference). One positive: ``r = 1 - alpha`` on
    it. alpha=0.1.
    """

    def __init__(self, alpha: float = 0.1) -> None:
        super().__init__()
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"LabelRelaxationLoss: alpha must be in (0, 1), got {alpha}")
        self.alpha = alpha

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, log_probs, log_p = _log_p_pos("LabelRelaxationLoss", scores, positives, valid,
                                            self.last_stats)
        with torch.no_grad():  # the projection r of p onto the credal set (no gradient)
            tiny = torch.finfo(scores.dtype).tiny
            p_pos = log_p.exp()[:, None]
            target = log_probs.exp() * (self.alpha / (1 - p_pos).clamp(min=tiny))
            pos_target = (log_probs.gather(1, prep.pset.idx).exp() * (1 - self.alpha)
                          / p_pos.clamp(min=tiny))
            target[prep.pset.rows, prep.pset.cols] = pos_target[prep.pset.ok]
            inside = p_pos[:, 0] >= 1 - self.alpha
        kl = (torch.xlogy(target, target) - target * log_probs).sum(dim=1)
        return mean_over(torch.where(inside, torch.zeros_like(kl), kl), prep.used, scores)
