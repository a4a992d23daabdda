"""Input checks and masked reductions shared by every loss in ``gsdistill.losses``.

Losses take tensors from upstream code; a wrong shape or a NaN must fail here with a message
that names the loss and the problem, not deep inside autograd.

Value checks (NaN/inf, negative grades, counts in ``last_stats``) read tensor values on the host:
on a GPU each one waits for the device (a host sync). They are on by default, so a loss called by
hand fails clearly; a training loop that has seen one good step turns them off with
``set_checks(False)`` (or ``with checks(False): ...``) and watches the loss for divergence itself.
With checks off the losses skip the value checks (shape and dtype checks cost nothing and stay),
``last_stats`` holds 0-dim tensors instead of ints, and the pretraining losses (SumMargLH,
JointLH, DINO, iBOT, KoLeo, Sinkhorn-Knopp with a logit bound) do no host sync at all
(``gsdistill.losses.syncs`` counts them; ``tests/test_losses_syncs.py``).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor

_CHECKS = {"enabled": True}


def set_checks(enabled: bool) -> None:
    """Turn the value checks of every loss on (the default) or off (no host syncs; see module doc)."""
    _CHECKS["enabled"] = bool(enabled)


def checks_enabled() -> bool:
    """Whether losses check values (NaN/inf, grades) and report ``last_stats`` as Python numbers."""
    return _CHECKS["enabled"]


@contextmanager
def checks(enabled: bool) -> Iterator[None]:
    """``with checks(False): ...`` -- value checks off (or on) inside the block, restored after."""
    before = checks_enabled()
    set_checks(enabled)
    try:
        yield
    finally:
        set_checks(before)


def all_finite(x: Tensor) -> bool:
    """True when no entry is NaN/inf (always True with checks off: no host sync). A NaN or inf
    entry makes the sum NaN/inf, so a finite sum settles it in one cheap reduction; only a
    non-finite sum (maybe an overflow) needs the full test."""
    if not checks_enabled():
        return True
    if bool(torch.isfinite(x.detach().sum())):
        return True
    return bool(torch.isfinite(x).all())


def check_scores(name: str, scores: Tensor, ndim: int = 2) -> None:
    """Raise ``ValueError`` unless ``scores`` is a floating tensor of ``ndim`` dims with finite values."""
    if not isinstance(scores, Tensor):
        raise ValueError(f"{name}: scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise ValueError(f"{name}: scores must be floating point, got dtype {scores.dtype}")
    if scores.dim() != ndim:
        raise ValueError(f"{name}: scores must have {ndim} dims, got shape {tuple(scores.shape)}")
    if scores.shape[-1] == 0:
        raise ValueError(f"{name}: no candidates (last dim is 0), shape {tuple(scores.shape)}")
    if not all_finite(scores):
        n_bad = int((~torch.isfinite(scores)).sum())
        raise ValueError(f"{name}: scores contain {n_bad} NaN/inf values (shape {tuple(scores.shape)})")


def check_like(name: str, what: str, scores: Tensor, other: Tensor | None, dtype: str) -> Tensor | None:
    """Check ``other`` has the shape of ``scores``; ``dtype`` is "bool" (a mask) or "float" (labels)."""
    if other is None:
        return None
    if not isinstance(other, Tensor):
        raise ValueError(f"{name}: {what} must be a torch.Tensor, got {type(other).__name__}")
    if other.shape != scores.shape:
        raise ValueError(f"{name}: {what} shape {tuple(other.shape)} does not match scores shape "
                         f"{tuple(scores.shape)}")
    if dtype == "bool":
        if other.dtype != torch.bool:
            raise ValueError(f"{name}: {what} must be a bool mask, got dtype {other.dtype}")
        return other.to(scores.device)
    if not other.is_floating_point():
        other = other.to(scores.dtype)
    if not all_finite(other):
        raise ValueError(f"{name}: {what} contain NaN/inf values")
    return other.to(device=scores.device, dtype=scores.dtype)


def big_negative(dtype: torch.dtype) -> float:
    """A finite stand-in for -inf: exp() of it is 0, yet sums and gradients of it stay finite.

    (A true -inf in a fully masked row makes logsumexp's backward compute exp(-inf + inf) = NaN.)
    """
    return torch.finfo(dtype).min / 8


def masked_log_softmax(x: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """log-softmax over the entries where ``mask`` is True; masked entries get a huge negative value."""
    return torch.log_softmax(x.masked_fill(~mask, big_negative(x.dtype)), dim=dim)


def mean_over(values: Tensor, used: Tensor, like: Tensor) -> Tensor:
    """Mean of ``values[used]``; 0 (still attached to ``values``' graph, which hangs off ``like``)
    when nothing is used. No host sync: the count stays a tensor, and unused entries (maybe
    inf/NaN) are cut out by ``where``, gradient included."""
    total = torch.where(used, values, torch.zeros_like(values)).sum()
    return total / used.sum().clamp(min=1).to(total.dtype)
