"""A small learned box encoder: an alternative geometric target to the frozen text encoder.

Beyond paper 003, which embeds box-text descriptors with the frozen text encoder. Here a box is
(class, centre x, centre y, width, height in 0..1 of the page) and its embedding is

    e = normalize(MLP([class_embedding(c) ; fourier(cx, cy, w, h)]))

with ``fourier(v) = [sin(2^k pi v), cos(2^k pi v)]`` for k = 0..n_freq-1 over each of the four
coordinates (NeRF-style positional encoding, Mildenhall et al. 2020 §5.1): the low frequencies give
an embedding whose cosine falls smoothly with the distance of two boxes, the high ones separate
nearby boxes. Trained jointly with the image model it plays the text tower's role for the
geometric head; at initialisation it is already a geometry-preserving target (measured by
``tools/bench/bench_descriptors.py``, docs/learning.md "Geometric targets").
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gsdistill.tuples.descriptors import box_geometry
from gsdistill.tuples.labels import CLASS_TO_ID, DOCLAYNET_CLASSES


def fourier_features(coords: torch.Tensor, n_freq: int) -> torch.Tensor:
    """``[N, C]`` coordinates in 0..1 -> ``[N, 2 * C * n_freq]`` (sin, cos of 2^k pi x per coordinate)."""
    freqs = math.pi * 2.0 ** torch.arange(n_freq, dtype=coords.dtype, device=coords.device)  # [F]
    angles = coords.unsqueeze(-1) * freqs  # [N, C, F]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).flatten(1)


def page_boxes(page: dict, max_boxes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(class ids [R] long, geometry [R, 4] float in 0..1: centre x, centre y, width, height) of a page."""
    boxes = page["boxes"] if max_boxes is None else page["boxes"][:max_boxes]
    ids = torch.tensor([CLASS_TO_ID[b["category"]] for b in boxes], dtype=torch.long)
    geometry = torch.tensor([box_geometry(b["bbox"], page["width"], page["height"]) for b in boxes],
                            dtype=torch.float32).reshape(len(boxes), 4) / 1000.0
    return ids, geometry


class BoxEncoder(nn.Module):
    """``forward(class_ids [N], geometry [N, 4]) -> [N, out_dim]`` unit vectors (see module docstring)."""

    def __init__(self, out_dim: int = 384, class_dim: int = 32, n_freq: int = 6, hidden_dim: int = 256,
                 num_classes: int = len(DOCLAYNET_CLASSES)):
        super().__init__()
        self.n_freq = int(n_freq)
        self.classes = nn.Embedding(num_classes, class_dim)
        self.mlp = nn.Sequential(nn.Linear(class_dim + 8 * self.n_freq, hidden_dim), nn.GELU(),
                                 nn.Linear(hidden_dim, out_dim))

    def forward(self, class_ids: torch.Tensor, geometry: torch.Tensor) -> torch.Tensor:
        if geometry.ndim != 2 or geometry.shape[-1] != 4 or class_ids.shape != geometry.shape[:1]:
            raise ValueError(f"BoxEncoder wants class ids [N] and geometry [N, 4], got "
                             f"{tuple(class_ids.shape)} and {tuple(geometry.shape)}")
        x = torch.cat([self.classes(class_ids), fourier_features(geometry, self.n_freq)], dim=-1)
        return F.normalize(self.mlp(x), dim=-1)
