"""Gaussian 2-Wasserstein loss over the whole batch (paper 002 §3.2 and §A; SyCL)."""
from __future__ import annotations

import torch
from torch import Tensor

from gsdistill.losses.graded_common import GradedLoss, prepare_graded
from gsdistill.losses.validation import big_negative


def gaussian_w2_from_samples(x: Tensor, y: Tensor) -> Tensor:
    """Squared 2-Wasserstein distance between Gaussians fitted to the rows of ``x``, ``y: [n, D]``.

    ``W = ||mu_x - mu_y||^2 + tr(C_x + C_y - 2 (C_x^{1/2} C_y C_x^{1/2})^{1/2})`` with the
    unbiased covariances ``C = Xc^T Xc / (n - 1)`` (Xc: centred rows). Paper 002 prints a minus
    before the trace: a misprint (NOTES.md, seeds/README.md); this is the correct, >= 0 form.
    Since ``tr (C_x^{1/2} C_y C_x^{1/2})^{1/2} = ||Xc Yc^T||_* / (n - 1)`` (the eigenvalues of
    C_x C_y are the squared singular values of Xc Yc^T / (n - 1)), only an ``[n, n]`` matrix
    is decomposed, never ``[D, D]``, and ``svdvals`` has stable gradients. n == 1: mean term only.
    """
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"gaussian_w2_from_samples: shapes {tuple(x.shape)} and {tuple(y.shape)} "
                         "must be equal and 2-D")
    n = x.shape[0]
    mean_term = (x.mean(dim=0) - y.mean(dim=0)).pow(2).sum()
    if n < 2:
        return mean_term
    xc = x - x.mean(dim=0, keepdim=True)
    yc = y - y.mean(dim=0, keepdim=True)
    cross = torch.linalg.svdvals(xc @ yc.t()).sum()
    trace_term = (xc.pow(2).sum() + yc.pow(2).sum() - 2.0 * cross) / (n - 1)
    return mean_term + trace_term


def wasserstein_loss(scores: Tensor, labels: Tensor, valid: Tensor | None = None,
                     label_temperature: float = 1.0, stats: dict | None = None) -> Tensor:
    """SyCL loss: ``W2(softmax(s), softmax(y / T_y))`` with each anchor row as one sample.

    Shapes: ``scores, labels: [B, N]`` (N candidates incl. in-batch documents with grade 0),
    ``valid: bool[B, N] | None`` (padding gets probability 0 on both sides). Anchors without a
    positive grade are left out of the batch and counted. Computed in float64 (SyCL), returned in
    the scores' dtype. Temperature on the scores is the caller's (scores are logits).
    """
    valid, labels, _, _, used = prepare_graded("WassersteinLoss", scores, labels, valid, stats)
    logits = scores.to(torch.float64)
    grades = labels.to(torch.float64) / label_temperature
    if valid is not None:
        logits = logits.masked_fill(~valid, big_negative(torch.float64))
        grades = grades.masked_fill(~valid, big_negative(torch.float64))
    if not bool(used.all()):
        logits, grades = logits[used], grades[used]
    if logits.shape[0] == 0:
        return scores.sum() * 0.0
    dist = gaussian_w2_from_samples(torch.softmax(logits, dim=1), torch.softmax(grades, dim=1))
    return dist.to(scores.dtype)


class WassersteinLoss(GradedLoss):
    """Batch Gaussian 2-Wasserstein loss (see ``wasserstein_loss``); forward(scores, labels, valid)."""

    def __init__(self, label_temperature: float = 1.0) -> None:
        super().__init__()
        self.label_temperature = label_temperature

    def forward(self, scores: Tensor, labels: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return wasserstein_loss(scores, labels, valid, self.label_temperature, self.last_stats)
