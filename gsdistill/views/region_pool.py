"""Which patch tokens of a global view each layout box covers: the pooling weights of the region term.

``objective.region_geom`` aligns the patch tokens inside each layout box with that box's descriptor
(``gsdistill.models.region_text``). The views pipeline tracks the page's layout boxes through each
global crop (albumentations, as ``track_boxes`` does) and turns them here into a matrix
``float32[S, P]`` per view: row ``s`` holds, for box ``s`` of the page (the row of its descriptor in
``geom_emb``: one descriptor per box, in the page's box order, the first ``max_spans``), the share of
that box's area that falls in each of the view's ``P`` patch cells (row-major), so ``row @ tokens``
is the area-weighted mean of the tokens the box covers. A box the crop cut away (or with no area
left) has a zero row: it is no anchor.
"""
from __future__ import annotations

import numpy as np


def layout_only(page: dict) -> dict:
    """The page without its spans: what ``page_boxes`` should track when only layout boxes are wanted."""
    return {**page, "spans": []}


def region_pool_weights(bboxes: np.ndarray, labels: list[str], grid: tuple[int, int], patch_size: int,
                        n_boxes: int) -> np.ndarray:
    """``bboxes float[N, 4]`` (view pixels, ``x0 y0 x1 y1``) labelled ``box:<i>`` (others ignored) ->
    ``float32[n_boxes, gh * gw]``: row ``i`` = box ``i``'s area share per patch cell (sums to 1), or zeros
    where box ``i`` is not in the view or ``i >= n_boxes``."""
    gh, gw = grid
    out = np.zeros((n_boxes, gh * gw), dtype=np.float32)
    edges_x = np.arange(gw + 1, dtype=np.float32) * patch_size
    edges_y = np.arange(gh + 1, dtype=np.float32) * patch_size
    for (x0, y0, x1, y1), label in zip(np.asarray(bboxes, dtype=np.float32).reshape(-1, 4), labels):
        kind, _, index = str(label).partition(":")
        i = int(index) if kind == "box" and index.isdigit() else -1
        if not 0 <= i < n_boxes:
            continue
        ox = np.clip(np.minimum(x1, edges_x[1:]) - np.maximum(x0, edges_x[:-1]), 0, None)  # [gw]
        oy = np.clip(np.minimum(y1, edges_y[1:]) - np.maximum(y0, edges_y[:-1]), 0, None)  # [gh]
        area = np.outer(oy, ox).reshape(-1)
        if area.sum() > 0:
            out[i] = area / area.sum()
    return out
