"""iBOT block masks for the student's global views (DINOv2's masking generator, paper 003 §4.4).

A mask covers ``ratio`` of the ``h x w`` patch grid with rectangular blocks of at least
``min_block`` patches whose aspect ratio is log-uniform in ``[aspect, 1/aspect]``. Each global view is
masked with probability ``mask_prob``, at a ratio drawn from ``mask_ratio``.
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
