"""Patch-token spread: VICReg's variance and covariance terms on a backbone's patch tokens.

Why: on real pages the GSDistill terms (all of which read a pooled page embedding, or prototype
scores of masked patches) fold the patch tokens of a ViT onto about one direction (effective rank
~1.1 of 192 after 1,200 steps, a random ViT 27; docs/learning.md, "Real documents"), and a detection
head on the frozen backbone then does worse than on a random one. This term keeps the tokens'
variance spread over the channels, at the level the detection head reads them.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from gsdistill.losses.precision import fp32, no_autocast
from gsdistill.losses.validation import check_scores


class PatchSpreadLoss(nn.Module):
    """Variance + covariance regulariser of VICReg (Bardes et al., ICLR 2022, eqs. 1 and 3).

    For tokens ``x: [N, D]`` (rows = patch tokens of a batch, any number of views and pages),
    centred per channel, ``C = x^T x / (N - 1)``::

        v(x) = (1/D) sum_j max(0, gamma - sqrt(C_jj + eps))
        c(x) = (1/D) sum_{i != j} C_ij^2
        L    = v(x) + cov_weight * c(x)

    ``v`` keeps every channel's standard deviation over tokens at least ``gamma``; ``c`` decorrelates
    channels, so the variance cannot sit in one direction shared by all channels (which ``v`` alone
    allows). VICReg weights them 25 : 1; ``cov_weight`` is the ratio. Per process (no gather): the
    statistics of one rank's tokens are already over thousands of rows. Computed in float32 with
    autocast off (float64 kept). Shape: ``x: [N, D]`` with N >= 2; scalar out.
    """

    def __init__(self, gamma: float = 1.0, cov_weight: float = 0.04, eps: float = 1e-4) -> None:
        super().__init__()
        if gamma <= 0 or cov_weight < 0:
            raise ValueError(f"PatchSpreadLoss: need gamma > 0 and cov_weight >= 0, got {gamma}, {cov_weight}")
        self.gamma, self.cov_weight, self.eps = float(gamma), float(cov_weight), float(eps)

    def terms(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(variance term, covariance term) of ``x: [N, D]``."""
        check_scores("PatchSpreadLoss", x)
        if x.dim() != 2 or x.shape[0] < 2:
            raise ValueError(f"PatchSpreadLoss: need tokens [N >= 2, D], got shape {tuple(x.shape)}")
        with no_autocast(x):
            z = fp32(x)
            z = z - z.mean(dim=0)
            cov = z.t() @ z / (z.shape[0] - 1)
            var = torch.relu(self.gamma - torch.sqrt(cov.diagonal() + self.eps)).mean()
            off = cov - torch.diag_embed(cov.diagonal())
            return var, off.square().sum() / z.shape[1]

    def forward(self, x: Tensor) -> Tensor:
        var, cov = self.terms(x)
        return var + self.cov_weight * cov
