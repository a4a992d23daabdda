"""Candidate masks -> compact per-anchor index lists, and the ``last_stats`` counts.

Positives are few per anchor (<= 8 typical) among thousands of candidates, so every loss gathers
the positives into ``[B, P]`` slots (P = most positives of any anchor) instead of masking the whole
``[B, N]`` matrix again and again: a gather's backward is a cheap scatter.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from gsdistill.losses.validation import check_like, check_scores, checks_enabled


class PositiveSet(NamedTuple):
    """Positives of each anchor: ``idx long[B, P]`` (column order, padded with 0), ``ok bool[B, P]``
    (real slot), ``count long[B]``; ``rows``/``cols`` the flat (anchor, candidate) pairs."""

    idx: Tensor
    ok: Tensor
    count: Tensor
    rows: Tensor
    cols: Tensor


def true_entries(mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(rows, cols)`` of the True entries of ``mask: bool[B, N]`` in row-major order.

    Scans the mask as int64 words (8 entries each) and decodes only the non-zero words: about 8x
    less work than ``nonzero`` on a sparse mask (1-D bool scans are slow on the CPU).
    """
    batch, n_cand = mask.shape
    if n_cand and n_cand % 8 == 0 and mask.is_contiguous() and mask.storage_offset() % 8 == 0:
        words = mask.view(torch.int64)
        w_rows, w_cols = words.nonzero(as_tuple=True)
        packed = mask.view(torch.uint8).view(batch, n_cand // 8, 8)[w_rows, w_cols]
        hit, byte = packed.nonzero(as_tuple=True)
        return w_rows[hit], w_cols[hit] * 8 + byte
    rows, cols = mask.nonzero(as_tuple=True)
    return rows, cols


def graded_entries(grades: Tensor) -> tuple[Tensor, Tensor]:
    """``(rows, cols)`` where ``grades: float[B, N]`` (all >= 0, checked by the caller) is > 0.

    Non-negative floats are > 0 exactly when their bits are non-zero (bar -0.0, filtered after),
    so the grades are scanned as int64 words without building a bool mask first."""
    batch, n_cand = grades.shape
    per_word = 8 // grades.element_size() if grades.dtype in (torch.float32, torch.float64) else 0
    if not per_word or n_cand % per_word or not grades.is_contiguous() \
            or grades.storage_offset() % per_word:
        return true_entries(grades > 0)
    w_rows, w_cols = grades.view(torch.int64).nonzero(as_tuple=True)
    packed = grades.view(batch, n_cand // per_word, per_word)[w_rows, w_cols]
    hit, within = (packed > 0).nonzero(as_tuple=True)
    return w_rows[hit], w_cols[hit] * per_word + within


def positive_set(mask: Tensor | None = None, entries: tuple[Tensor, Tensor] | None = None,
                 batch: int | None = None) -> PositiveSet:
    """Slots of the True entries of ``mask: bool[B, N]`` (row-major, so ``idx[:, 0]`` is the first),
    or of given row-major ``entries = (rows, cols)`` of a ``batch``-row matrix."""
    if mask is not None:
        batch, entries = mask.shape[0], true_entries(mask)
    rows, cols = entries
    count = torch.bincount(rows, minlength=batch)
    n_slots = max(int(count.max()), 1) if batch else 1
    device = rows.device
    slot = torch.arange(rows.numel(), device=device) - (count.cumsum(0) - count)[rows]
    idx = torch.zeros(batch, n_slots, dtype=torch.long, device=device)
    idx[rows, slot] = cols
    ok = torch.arange(n_slots, device=device) < count[:, None]  # slots fill from the left
    return PositiveSet(idx, ok, count, rows, cols)


class Prepared(NamedTuple):
    """Validated inputs of a multi-positive loss: ``valid`` (None = all), positives, counts."""

    valid: Tensor | None
    pos: Tensor
    pset: PositiveSet
    n_valid: Tensor
    used: Tensor


def _checked_masks(name: str, scores: Tensor, positives: Tensor | None,
                   valid: Tensor | None) -> tuple[Tensor | None, Tensor]:
    """``(valid, positives & valid)`` after the shape/dtype (and, with checks on, value) checks."""
    check_scores(name, scores)
    if positives is None:
        raise ValueError(f"{name}: positives mask is required")
    positives = check_like(name, "positives", scores, positives, "bool")
    valid = check_like(name, "valid", scores, valid, "bool")
    return valid, (positives if valid is None else positives & valid)


def prepare_masks(name: str, scores: Tensor, positives: Tensor, valid: Tensor | None,
                  stats: dict | None) -> Prepared:
    """Validate ``scores [B, N]``, ``positives`` and ``valid`` (bool, same shape); count anchors.

    Positives are ``positives & valid``, negatives ``valid & ~positives``; anchors without a
    positive are ``used == False``. Fills ``stats`` (see ``fill_stats``) when given.
    """
    valid, pos = _checked_masks(name, scores, positives, valid)
    pset = positive_set(pos)
    if valid is None:
        n_valid = torch.full_like(pset.count, scores.shape[1])
    else:
        n_valid = valid.sum(dim=1)
    used = pset.count > 0
    if stats is not None:
        fill_stats(stats, used, pset.count, n_valid - pset.count)
    return Prepared(valid, pos, pset, n_valid, used)


def prepare_dense(name: str, scores: Tensor, positives: Tensor, valid: Tensor | None,
                  stats: dict | None) -> tuple[Tensor | None, Tensor, Tensor]:
    """``(valid, positives & valid, used)`` without index lists: the host-sync-free inputs of the
    dense paths that multi-positive losses take with checks off (same checks as ``prepare_masks``,
    minus the value checks that ``checks_enabled`` turns off)."""
    valid, pos = _checked_masks(name, scores, positives, valid)
    n_pos = pos.sum(dim=1)
    used = n_pos > 0
    if stats is not None:
        n_valid = valid.sum(dim=1) if valid is not None else torch.full_like(n_pos, scores.shape[1])
        fill_stats(stats, used, n_pos, n_valid - n_pos)
    return valid, pos, used


def fill_stats(stats: dict, used: Tensor, n_pos: Tensor, n_neg: Tensor) -> None:
    """The counts every multi-positive / graded / noisy loss reports in ``last_stats``: Python
    numbers, or 0-dim tensors with checks off (reading them is the reader's host sync)."""
    if not checks_enabled():
        n_used = used.sum()
        stats.update(anchors_used=n_used, anchors_without_positive=used.numel() - n_used,
                     anchors_without_negative=(used & (n_neg == 0)).sum(),
                     mean_positives=torch.where(used, n_pos, 0).sum() / n_used.clamp(min=1))
        return
    n_used = int(used.sum())
    stats.update(
        anchors_used=n_used,
        anchors_without_positive=int(used.numel() - n_used),
        anchors_without_negative=int((used & (n_neg == 0)).sum()),
        mean_positives=float(n_pos[used].float().mean()) if n_used else 0.0,
    )
