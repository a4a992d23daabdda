"""Soft-target list-wise losses over graded labels: ListNet and KL divergence (paper 002 §A).

Both compare ``t = softmax(y / T_y)`` with ``softmax(s)`` per anchor. Grades are >= 0 and most
candidates (in-batch documents) have grade 0, which all get the same target probability
``c = 1 / (#grade-0 + sum_{p: y_p > 0} e^{y_p / T_y})``. So, exactly,
``-sum_n t_n log softmax(s)_n = LSE(s) - c sum_valid s - sum_P (t_p - c) s_p`` (P: graded
candidates): no dense target matrix is ever built; one fused log-sum-exp with a hand-written
backward (``fast_lse``) does the ``[B, N]`` work.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gsdistill.losses.fast_lse import lse_minus_linear
from gsdistill.losses.graded_common import GradedLoss, prepare_graded
from gsdistill.losses.validation import mean_over


def _listwise_terms(name: str, scores: Tensor, labels: Tensor, valid: Tensor | None,
                    label_temperature: float, stats: dict | None):
    """``(cross-entropy [B], target entropy [B], used [B])`` of the two losses."""
    if label_temperature <= 0:
        raise ValueError(f"{name}: label_temperature must be > 0, got {label_temperature}")
    valid, labels, pset, n_valid, used = prepare_graded(name, scores, labels, valid, stats)
    n_zero = (n_valid - pset.count).to(scores.dtype)
    with torch.no_grad():  # the target: only the graded slots and the grade-0 count matter
        z_pos = (labels.gather(1, pset.idx) / label_temperature).masked_fill(~pset.ok, -torch.inf)
        peak = z_pos.amax(dim=1).clamp(min=0.0)
        lse_target = peak + torch.log(n_zero * torch.exp(-peak)
                                      + torch.exp(z_pos - peak[:, None]).sum(dim=1))
        log_t_pos = (z_pos - lse_target[:, None]).masked_fill(~pset.ok, 0.0)
        t_pos = torch.exp(log_t_pos).masked_fill(~pset.ok, 0.0)
        t_zero = torch.exp(-lse_target)
        entropy = n_zero * t_zero * lse_target - (t_pos * log_t_pos).sum(dim=1)
    # CE = LSE(s) - t_zero * sum_valid s - sum_P (t_p - t_zero) s_p   (the targets sum to 1)
    empty = pset.idx[:0, 0]
    cross_entropy = lse_minus_linear(scores, empty, empty, valid, pset.rows, pset.cols,
                                     (t_pos - t_zero[:, None])[pset.ok], t_zero)
    return cross_entropy, entropy, used


def listnet_loss(scores: Tensor, labels: Tensor, valid: Tensor | None = None,
                 label_temperature: float = 1.0, stats: dict | None = None) -> Tensor:
    """ListNet top-1 (Cao et al. 2007): ``-sum_d softmax(y / T_y)_d log softmax(s)_d`` per anchor.

    Shapes ``scores, labels: [B, N]``, ``valid: bool[B, N] | None``; mean over anchors with a
    positive grade (paper 002 Table 3 baseline).
    """
    cross_entropy, _, used = _listwise_terms("ListNetLoss", scores, labels, valid,
                                             label_temperature, stats)
    return mean_over(cross_entropy, used, scores)


def kl_list_loss(scores: Tensor, labels: Tensor, valid: Tensor | None = None,
                 label_temperature: float = 1.0, stats: dict | None = None) -> Tensor:
    """``KL(softmax(y / T_y) || softmax(s))`` per anchor (paper 002 §A "KL Divergence").

    = ListNet minus the (constant) entropy of the target; same gradient, zero at the optimum.
    """
    cross_entropy, entropy, used = _listwise_terms("KLListLoss", scores, labels, valid,
                                                   label_temperature, stats)
    return mean_over(cross_entropy - entropy, used, scores)


class ListNetLoss(GradedLoss):
    """ListNet (see ``listnet_loss``). ``ListNetLoss(label_temperature=1.0)``."""

    def __init__(self, label_temperature: float = 1.0) -> None:
        super().__init__()
        self.label_temperature = label_temperature

    def forward(self, scores: Tensor, labels: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return listnet_loss(scores, labels, valid, self.label_temperature, self.last_stats)


class KLListLoss(GradedLoss):
    """KL list-wise loss (see ``kl_list_loss``). ``KLListLoss(label_temperature=1.0)``."""

    def __init__(self, label_temperature: float = 1.0) -> None:
        super().__init__()
        self.label_temperature = label_temperature

    def forward(self, scores: Tensor, labels: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return kl_list_loss(scores, labels, valid, self.label_temperature, self.last_stats)
