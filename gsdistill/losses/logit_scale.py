"""Learnable (or fixed) logit scale turning cosine similarities into logits (CLIP style)."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class LogitScale(nn.Module):
    """``logits = min(exp(log_scale), max_scale) * cos_sims``, ``log_scale`` initialised to log(1/T).

    Paper 003 Table A2: init log(1/0.07), MP temperature 0.07. ``learnable=False`` gives a fixed
    temperature (a buffer, saved with the state dict). The clamp acts on ``log_scale`` so the
    scale never exceeds ``max_scale`` (CLIP clamps at 100). Shapes: any ``cos_sims``, same out.
    """

    def __init__(self, init_temperature: float = 0.07, learnable: bool = True,
                 max_scale: float = 100.0) -> None:
        super().__init__()
        if init_temperature <= 0:
            raise ValueError(f"LogitScale: init_temperature must be > 0, got {init_temperature}")
        if max_scale <= 0:
            raise ValueError(f"LogitScale: max_scale must be > 0, got {max_scale}")
        init = torch.tensor(math.log(1.0 / init_temperature), dtype=torch.float32)
        if learnable:
            self.log_scale = nn.Parameter(init)
        else:
            self.register_buffer("log_scale", init)
        self.max_log_scale = math.log(max_scale)

    @property
    def scale(self) -> Tensor:
        """The current multiplier (a 0-dim tensor, clamped to ``max_scale``)."""
        return torch.clamp(self.log_scale, max=self.max_log_scale).exp()

    @property
    def temperature(self) -> float:
        """1 / scale, as a float for logging."""
        return float(1.0 / self.scale.detach())

    def forward(self, cos_sims: Tensor) -> Tensor:
        return self.scale.to(cos_sims.dtype) * cos_sims
