"""Projection heads of the GSDistill model (paper 003 §4.1-4.3, Table A2).

- :class:`ProjectionHead`: page embedding ``h_p`` -> 256-d semantic or geometric embedding.
- :class:`TextProjection`: frozen text-encoder embedding -> the same 256-d space (trainable).
- :class:`DINOHead`: the self-distillation head shared by the DINO (pooled) and iBOT (patch) losses:
  MLP ``in -> hidden -> hidden -> bottleneck``, L2-normalise, weight-normalised linear
  ``bottleneck -> K`` without bias and with unit gain (DINOv2 layout; Table A2: K = 65,536, hidden = 2,048).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from gsdistill.losses.precision import fp32, no_autocast


def _trunc_normal_init(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class ProjectionHead(nn.Module):
    """``h_p [N, C] -> [N, out_dim]``; a linear map, or an MLP with one GELU hidden layer when hidden > 0."""

    def __init__(self, in_dim: int, out_dim: int = 256, hidden_dim: int = 0):
        super().__init__()
        if hidden_dim > 0:
            self.net = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, out_dim))
        else:
            self.net = nn.Linear(in_dim, out_dim)
        _trunc_normal_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TextProjection(nn.Module):
    """Trainable projection of cached frozen text embeddings ``[..., D_text] -> [..., out_dim]``."""

    def __init__(self, text_dim: int, out_dim: int = 256):
        super().__init__()
        self.proj = nn.Linear(text_dim, out_dim)
        _trunc_normal_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class _NormalizeRows(torch.autograd.Function):
    """``w / max(||w||, eps)`` per row (``F.normalize(w, dim=-1)``) with a hand-written backward,
    ``inv * (g - out <g, out>)`` (``inv * g`` for rows clamped at eps). Autograd through F.normalize
    makes some ten [K, bottleneck] temporaries a step, each a fresh 67 MB allocation at K = 65,536
    that the CPU pays for in page faults: 0.31 s of fwd + bwd on one core, 0.13 s this way."""

    @staticmethod
    def forward(ctx, w: torch.Tensor, eps: float) -> torch.Tensor:
        norm = torch.linalg.vector_norm(w, dim=-1, keepdim=True)
        inv = norm.clamp_min(eps).reciprocal()
        out = w * inv
        ctx.save_for_backward(out, inv, norm > eps)
        return out

    @staticmethod
    @once_differentiable  # its own products are not on the graph: a second derivative raises
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out, inv, active = ctx.saved_tensors
        # <g, out> per row as a batched [1, D] x [D, 1] product: no [K, D] temporary
        dot = torch.bmm(grad.unsqueeze(1), out.unsqueeze(2)).squeeze(2) * active
        return torch.addcmul(grad, out, dot, value=-1).mul_(inv), None


def normalize_rows(w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Rows of ``w [K, D]`` scaled to unit L2 norm (rows shorter than ``eps`` divided by ``eps``)."""
    return _NormalizeRows.apply(w, eps)


class DINOHead(nn.Module):
    """Self-distillation head: ``[N, in_dim] -> logits [N, out_dim]`` (prototype scores, before temperature)."""

    def __init__(self, in_dim: int, out_dim: int = 65536, hidden_dim: int = 2048,
                 bottleneck_dim: int = 256, n_layers: int = 3):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"DINOHead needs n_layers >= 1, got {n_layers}")
        layers: list[nn.Module] = []
        dim = in_dim
        for _ in range(n_layers - 1):
            layers += [nn.Linear(dim, hidden_dim), nn.GELU()]
            dim = hidden_dim
        layers.append(nn.Linear(dim, bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        _trunc_normal_init(self.mlp)
        # prototypes: weight-normalised rows with the gain fixed to 1 (DINOv2's norm_last_layer), so
        # the logits are cosines in [-1, 1] and Sinkhorn-Knopp's exp() cannot overflow
        self.prototypes = nn.Parameter(torch.empty(out_dim, bottleneck_dim))
        nn.init.trunc_normal_(self.prototypes, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP may run in bf16; the cosines to the prototypes are float32 with autocast off: in
        bf16 they round by up to 4.8e-3, the size of the between-page spread a sharp teacher reads."""
        x = self.mlp(x)
        with no_autocast(x):
            x = F.normalize(fp32(x), dim=-1, eps=1e-6)
            return F.linear(x, normalize_rows(fp32(self.prototypes)).to(x.dtype))
