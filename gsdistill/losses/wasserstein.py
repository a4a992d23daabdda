"""Gaussian 2-Wasserstein loss over the whole batch (paper 002 §3.2 and §A; SyCL).

Speed: the cross term needs ``||Xc Yc^T||_*`` with ``X = softmax(s)``, ``Y = softmax(y / T)``
(``[B, N]``, N = thousands). A dense ``Xc Yc^T`` is a ``B x N x B`` float64 product (~37 ms at
256 x 4096). But each target row is a constant plus a sparse part: every valid grade-0 candidate
of row b gets the same probability ``c_b``, so ``Y = c v^T + S`` with ``v`` the (shared) valid
mask and ``S`` non-zero only at the graded candidates (``t_bp - c_b``). Each prediction row sums
to 1 over ``v``, so ``Xc v = 0`` (J = 11^T / B, ``Xc = (I - J) X``) and, exactly,

    Xc Yc^T = Xc Y^T (I - J) = Xc (c v^T + S)^T (I - J) = (I - J) X S^T (I - J),

where ``X S^T`` gathers only the graded columns: ``O(B^2 P)`` instead of ``O(B^2 N)``. It holds
when every row has the same valid mask (no padding, or the same padding in every row); otherwise
the dense product runs (``tests/test_losses_wasserstein.py`` checks both agree and gradchecks it).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gsdistill.losses.graded_common import GradedLoss, prepare_graded
from gsdistill.losses.validation import big_negative


def gaussian_w2_from_samples(x: Tensor, y: Tensor, cross: Tensor | None = None) -> Tensor:
    """Squared 2-Wasserstein distance between Gaussians fitted to the rows of ``x``, ``y: [n, D]``.

    ``W = ||mu_x - mu_y||^2 + tr(C_x + C_y - 2 (C_x^{1/2} C_y C_x^{1/2})^{1/2})`` with the
    unbiased covariances ``C = Xc^T Xc / (n - 1)`` (Xc: centred rows). Paper 002 prints a minus
    before the trace: a misprint (``../shared/seeds/README.md``; Mathiasen and Hvilshøj 2020,
    which paper 002 cites, has the plus); this is the correct, >= 0 form.
    Since ``tr (C_x^{1/2} C_y C_x^{1/2})^{1/2} = ||Xc Yc^T||_* / (n - 1)`` (the eigenvalues of
    C_x C_y are the squared singular values of Xc Yc^T / (n - 1)), only an ``[n, n]`` matrix
    is decomposed, never ``[D, D]``, and ``svdvals`` has stable gradients. n == 1: mean term only.
    ``cross``: ``Xc Yc^T [n, n]`` when the caller has a cheaper exact form (``wasserstein_loss``).
    """
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"gaussian_w2_from_samples: shapes {tuple(x.shape)} and {tuple(y.shape)} "
                         "must be equal and 2-D")
    n = x.shape[0]
    x_mean, y_mean = x.mean(dim=0), y.mean(dim=0)
    mean_term = (x_mean - y_mean).square().sum()
    if n < 2:
        return mean_term
    if cross is None:
        cross = (x - x_mean) @ (y - y_mean).t()
    # ||Xc||^2 = ||X||^2 - n ||mean||^2: no centred [n, D] copy (exact up to rounding in float64)
    spread = (x.square().sum() - n * x_mean.square().sum()) + (y.square().sum() - n * y_mean.square().sum())
    return mean_term + (spread - 2.0 * torch.linalg.svdvals(cross).sum()) / (n - 1)


def sparse_centred_cross(x: Tensor, idx: Tensor, s_vals: Tensor) -> Tensor:
    """``(I - J) X S^T (I - J)`` for ``S[b, idx[b, p]] = s_vals[b, p]`` (0 elsewhere; a padding
    slot carries ``s_vals = 0``): ``x: [n, N]``, ``idx, s_vals: [n, P]`` -> ``[n, n]``."""
    n, slots = idx.shape
    # rows of X^T are contiguous: gathering them is ~5x faster than gathering columns of X
    picked = x.t().contiguous().index_select(0, idx.reshape(-1)).view(n, slots, n)  # [b, p, a]
    xs = torch.bmm(s_vals.view(n, 1, slots), picked).view(n, n).t()  # xs[a, b] = sum_p x[a, idx[b, p]] s[b, p]
    xs = xs - xs.mean(dim=0, keepdim=True)
    return xs - xs.mean(dim=1, keepdim=True)


def wasserstein_loss(scores: Tensor, labels: Tensor, valid: Tensor | None = None,
                     label_temperature: float = 1.0, stats: dict | None = None,
                     dense: bool = False) -> Tensor:
    """SyCL loss: ``W2(softmax(s), softmax(y / T_y))`` with each anchor row as one sample.

    Shapes: ``scores, labels: [B, N]`` (N candidates incl. in-batch documents with grade 0),
    ``valid: bool[B, N] | None`` (padding gets probability 0 on both sides). Anchors without a
    positive grade are left out of the batch and counted. Computed in float64 (SyCL), returned in
    the scores' dtype. Temperature on the scores is the caller's (scores are logits). The cross
    term takes the sparse exact form of the module docstring when all rows share one valid mask;
    ``dense=True`` forces the dense product (the reference).
    """
    valid, labels, pset, _, used = prepare_graded("WassersteinLoss", scores, labels, valid, stats)
    logits = scores.to(torch.float64)
    grades = labels.to(torch.float64) / label_temperature
    if valid is not None:
        logits = logits.masked_fill(~valid, big_negative(torch.float64))
        grades = grades.masked_fill(~valid, big_negative(torch.float64))
    idx, ok = pset.idx, pset.ok
    if not bool(used.all()):
        logits, grades, idx, ok = logits[used], grades[used], idx[used], ok[used]
    if logits.shape[0] == 0:
        return scores.sum() * 0.0
    sparse = not dense and (valid is None or bool((valid == valid[:1]).all()))
    x = torch.softmax(logits, dim=1)
    lse = torch.logsumexp(grades, dim=1, keepdim=True)
    y = torch.exp(grades - lse)  # = softmax(grades); a grade-0 entry (logit 0) gets exp(-lse)
    cross = None
    if sparse:
        s_vals = (y.gather(1, idx) - torch.exp(-lse)).masked_fill(~ok, 0.0)
        cross = sparse_centred_cross(x, idx, s_vals)
    return gaussian_w2_from_samples(x, y, cross).to(scores.dtype)


class WassersteinLoss(GradedLoss):
    """Batch Gaussian 2-Wasserstein loss (see ``wasserstein_loss``); forward(scores, labels, valid)."""

    def __init__(self, label_temperature: float = 1.0) -> None:
        super().__init__()
        self.label_temperature = label_temperature

    def forward(self, scores: Tensor, labels: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return wasserstein_loss(scores, labels, valid, self.label_temperature, self.last_stats)
