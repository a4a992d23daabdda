"""iBOT block masks for the student's global views (DINOv2's masking generator, paper 003 §4.4).

A mask covers ``ratio`` of the ``h x w`` patch grid with rectangular blocks of at least
``min_block`` patches whose aspect ratio is log-uniform in ``[aspect, 1/aspect]``. Each global view is
masked with probability ``mask_prob``, at a ratio drawn from ``mask_ratio``: one view at a time
(:func:`view_mask`), or a whole batch at once (:func:`batch_masks`, what the training stream draws), with
the same distribution per view and a masked-patch count bounded for the run (:func:`masked_patch_bound`).
"""
from __future__ import annotations

import math

import numpy as np


def block_mask(h: int, w: int, n_masked: int, rng: np.random.Generator, min_block: int = 4,
               aspect: float = 0.3, max_tries: int = 10) -> np.ndarray:
    """bool[h, w] with exactly ``min(n_masked, h*w)`` True patches, grown block by block."""
    mask = np.zeros((h, w), dtype=bool)
    target = min(int(n_masked), h * w)
    log_aspect = (math.log(aspect), math.log(1 / aspect))
    while mask.sum() < target:
        missing = target - int(mask.sum())
        grown = 0
        for _ in range(max_tries):
            area = rng.uniform(min(min_block, missing), max(min(min_block, missing), missing))
            ar = math.exp(rng.uniform(*log_aspect))
            bh = max(1, min(h, int(round(math.sqrt(area * ar)))))
            bw = max(1, min(w, int(round(math.sqrt(area / ar)))))
            top, left = rng.integers(0, h - bh + 1), rng.integers(0, w - bw + 1)
            block = mask[top:top + bh, left:left + bw]
            new = int((~block).sum())
            if 0 < new <= missing:
                block[:] = True
                grown = new
                break
        if grown == 0:  # no block fits the remaining budget: finish with single random patches
            free = np.flatnonzero(~mask.ravel())
            mask.ravel()[rng.choice(free, size=missing, replace=False)] = True
    return mask


def view_mask(grid: tuple[int, int], mask_prob: float, mask_ratio: tuple[float, float],
              rng: np.random.Generator) -> np.ndarray:
    """bool[h*w] for one global view: masked with probability ``mask_prob``, covering a share drawn
    uniformly from ``mask_ratio`` (DINOv2 masks half the views with ratios in [0.1, 0.5])."""
    h, w = grid
    if rng.random() >= mask_prob:
        return np.zeros(h * w, dtype=bool)
    ratio = rng.uniform(*mask_ratio)
    return block_mask(h, w, max(1, int(round(ratio * h * w))), rng).ravel()


def masked_view_count(n_views: int, mask_prob: float) -> int:
    """Views :func:`batch_masks` masks in a batch of ``n_views``: ``mask_prob`` of them, rounded half up."""
    return min(n_views, int(math.floor(mask_prob * n_views + 0.5)))


def _stratum_edges(n_views: int, mask_prob: float, mask_ratio: tuple[float, float]) -> np.ndarray:
    return np.linspace(float(mask_ratio[0]), float(mask_ratio[1]), masked_view_count(n_views, mask_prob) + 1)


def _patches_at(ratio: float, n_patches: int) -> int:
    return min(n_patches, max(1, int(round(ratio * n_patches))))  # view_mask's count


def batch_masks(n_views: int, grid: tuple[int, int], mask_prob: float, mask_ratio: tuple[float, float],
                rng: np.random.Generator) -> np.ndarray:
    """``bool[n_views, h*w]``: the iBOT masks of one batch's global views, drawn as DINOv2's collate draws
    them. Exactly :func:`masked_view_count` views are masked, chosen at random; the i-th of them covers a
    share drawn from the i-th of as many equal sub-ranges of ``mask_ratio``. Each view on its own is
    distributed as :func:`view_mask` draws it (masked with ``mask_prob``, the share uniform in
    ``mask_ratio``), but the batch's masked-view and masked-patch counts no longer vary freely: they stay
    within :func:`masked_patch_bound`, so a compiled step's iBOT rows have a size fixed for the run."""
    h, w = grid
    edges = _stratum_edges(n_views, mask_prob, mask_ratio)
    out = np.zeros((n_views, h * w), dtype=bool)
    for i, view in enumerate(rng.permutation(n_views)[:len(edges) - 1]):  # random views, random order
        out[view] = block_mask(h, w, _patches_at(rng.uniform(edges[i], edges[i + 1]), h * w), rng).ravel()
    return out


def masked_patch_bound(n_views: int, grid: tuple[int, int], mask_prob: float,
                       mask_ratio: tuple[float, float]) -> int:
    """The most masked patches :func:`batch_masks` can draw for ``n_views`` views: each masked view at the
    top of its sub-range (the count is monotone in the share)."""
    n_patches = grid[0] * grid[1]
    return sum(_patches_at(top, n_patches) for top in _stratum_edges(n_views, mask_prob, mask_ratio)[1:])
