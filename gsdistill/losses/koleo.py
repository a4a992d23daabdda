"""KoLeo spreading regularisers: DINOv2's nearest-neighbour KoLeo and paper 003's KoLeo-hybrid."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gsdistill.losses.precision import fp32, no_autocast
from gsdistill.losses.validation import big_negative, check_scores


def _check_x(name: str, x: Tensor) -> None:
    check_scores(name, x)
    if x.shape[0] < 2:
        raise ValueError(f"{name}: need at least 2 rows, got shape {tuple(x.shape)}")


class KoLeoLoss(nn.Module):
    """Kozachenko-Leonenko entropy estimator (Sablayrolles et al. 2018; DINOv2).

    ``L = -(1/B) sum_i log(||x_i - x_nn(i) + eps|| + eps)`` on L2-normalised rows, nearest neighbour
    by dot product with the diagonal excluded, computed in float32, eps = 1e-8. Shape: ``x: [B, D]``.
    The eps inside the norm (as torch's PairwiseDistance) keeps duplicate rows finite, gradient too.
    Autocast off (a bf16 ``z @ z.T`` can pick another neighbour); returns float32 (float64 kept).
    """

    def __init__(self, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        _check_x("KoLeoLoss", x)
        with no_autocast(x):
            z = F.normalize(fp32(x), p=2, dim=-1, eps=self.eps)
            with torch.no_grad():
                dots = z @ z.t()
                dots.fill_diagonal_(-math.inf)
                nearest = dots.argmax(dim=1)
            dist = (z - z[nearest] + self.eps).norm(dim=-1)
            return -torch.log(dist + self.eps).mean()


class KoLeoHybridLoss(nn.Module):
    """KoLeo-hybrid (paper 003 eq. 1): soft repulsion over all pairs + attraction of related pairs.

    ``L = alpha * log E_{i != j} exp(sim(h_i, h_j)) + beta * (1/|P|) sum_{(u, v) in P} (1 - sim(h_u, h_v))``
    with ``sim`` the cosine of L2-normalised rows. P = pairs of rows of the same group: pass
    ``group_ids: long[B]`` to forward, or build the module with ``n_views`` for a view-major batch
    (rows ``v * B_pages + p``: every pair of views of one page is related, paper 003 §4.5). No pair
    -> the attraction term is 0. Shape: ``x: [B, D]``; scalar out. Paper 003 weights the whole term
    by lambda5 = 0.02 (Table A2) outside this module. Computed and returned in float32 (float64
    kept) with autocast off: the cosines of nearby views differ by less than bf16's step near 1.
    """

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, n_views: int = 1) -> None:
        super().__init__()
        if n_views < 1:
            raise ValueError(f"KoLeoHybridLoss: n_views must be >= 1, got {n_views}")
        self.alpha, self.beta, self.n_views = alpha, beta, n_views

    def forward(self, x: Tensor, group_ids: Tensor | None = None) -> Tensor:
        _check_x("KoLeoHybridLoss", x)
        n = x.shape[0]
        if group_ids is None:
            if n % self.n_views:
                raise ValueError(f"KoLeoHybridLoss: {n} rows are not a multiple of n_views="
                                 f"{self.n_views}")
            group_ids = torch.arange(n, device=x.device) % (n // self.n_views)
        elif group_ids.shape != (n,):
            raise ValueError(f"KoLeoHybridLoss: group_ids shape {tuple(group_ids.shape)} does not "
                             f"match rows ({n},) of x shape {tuple(x.shape)}")
        with no_autocast(x):
            z = F.normalize(fp32(x), p=2, dim=-1)
            sims = z @ z.t()
            off_diag = ~torch.eye(n, dtype=torch.bool, device=x.device)
            # masked reductions, not boolean selections: no host sync (n >= 2, so a row is never empty)
            off_sims = sims.masked_fill(~off_diag, big_negative(sims.dtype))
            repulsion = torch.logsumexp(off_sims.flatten(), dim=0) - math.log(n * (n - 1))
            related = (group_ids[:, None] == group_ids[None, :].to(x.device)) & off_diag
            n_pairs = related.sum().clamp(min=1).to(sims.dtype)
            attraction = torch.where(related, 1.0 - sims, torch.zeros_like(sims)).sum() / n_pairs
            return self.alpha * repulsion + self.beta * attraction
