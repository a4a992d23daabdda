"""Shared input handling for losses over graded labels ``float[B, N]`` (paper 002)."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from gsdistill.losses.masks import PositiveSet, graded_entries, positive_set
from gsdistill.losses.validation import all_finite, check_like, check_scores, checks_enabled


class GradedPrepared(NamedTuple):
    """Validated graded inputs: ``valid`` (None = all), ``labels`` (scores' dtype and device; 0 on
    padding), the graded candidates (``grade > 0`` and valid) as a ``PositiveSet``, ``n_valid [B]``,
    ``used [B]``."""

    valid: Tensor | None
    labels: Tensor
    pset: PositiveSet
    n_valid: Tensor
    used: Tensor


def prepare_graded(name: str, scores: Tensor, labels: Tensor, valid: Tensor | None,
                   stats: dict | None) -> GradedPrepared:
    """Validate ``scores [B, N]``, ``labels [B, N]`` (relevance grades >= 0, 0 = not relevant) and
    ``valid``; collect the graded candidates; count anchors (``used`` = has a graded candidate;
    the others are excluded and counted in ``stats``)."""
    check_scores(name, scores)
    if labels is None:
        raise ValueError(f"{name}: labels are required")
    if not isinstance(labels, Tensor) or labels.shape != scores.shape:
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"{name}: labels shape {shape} does not match scores shape {tuple(scores.shape)}")
    labels = labels.to(device=scores.device, dtype=scores.dtype)
    valid = check_like(name, "valid", scores, valid, "bool")
    seen = labels if valid is None else labels.masked_fill(~valid, 0.0)
    if checks_enabled():  # value checks read back to the host (validation.set_checks)
        if seen.numel() == 0:
            low = high = torch.zeros((), dtype=seen.dtype, device=seen.device)
        else:  # one pass; a NaN or inf entry shows up in one of them
            low, high = torch.aminmax(seen)
        if not (all_finite(low) and all_finite(high)):
            raise ValueError(f"{name}: labels contain NaN/inf values")
        if bool(low < 0):
            raise ValueError(f"{name}: labels must be relevance grades >= 0, got min {float(low)}")
    pset = positive_set(entries=graded_entries(seen), batch=scores.shape[0])
    n_valid = valid.sum(dim=1) if valid is not None else torch.full_like(pset.count, scores.shape[1])
    used = pset.count > 0
    if stats is not None:
        n_used = used.sum()
        stats.update(anchors_used=n_used, anchors_without_positive=used.numel() - n_used,
                     anchors_without_negative=(used & (pset.count == n_valid)).sum())
        if checks_enabled():  # Python numbers; with checks off 0-dim tensors (no host sync)
            stats.update({k: int(v) for k, v in stats.items() if k.startswith("anchors_")})
    return GradedPrepared(valid, seen, pset, n_valid, used)


class GradedLoss(nn.Module):
    """Base of graded list-wise losses: forward(scores, labels, valid=None); keeps ``last_stats``."""

    def __init__(self) -> None:
        super().__init__()
        self.last_stats: dict = {}


def make_generator(seed: int | None) -> torch.Generator | None:
    """A CPU generator for reproducible sampling, or None (torch's global RNG)."""
    return None if seed is None else torch.Generator().manual_seed(int(seed))
