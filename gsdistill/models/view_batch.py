"""Small index and pixel helpers that let the student see each global view once per step.

The alignment heads read whole global views (``objective.align_views: unmasked``), iBOT reads the
masked ones. Instead of a second backbone pass over every global view, the student's one call on the
global size takes ``[global views (masked as iBOT asks), unmasked copies of the masked views only]``
(DINOv2's one student call per crop size); the views iBOT left whole serve both. The indices are
known on the host (the data pipeline computes them beside ``mask_index``), so nothing here reads a
device value back.

Crops may come as ``uint8`` pixels (a quarter of the bytes to copy to the device) and are normalised
here, on the device, with the ImageNet statistics the views pipeline used to apply itself; or as pages
and crop rows (``views.device``), made into pixels here, in the step (:func:`view_pixels`).
"""
from __future__ import annotations

import torch
from torch.profiler import record_function

from gsdistill.views.pixels import IMAGENET_MEAN, IMAGENET_STD
from gsdistill.views.render import page_rows, render_views


def view_pixels(batch: dict, sizes: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised global and local views of a batch: its crops, or, when it carries pages and crop
    rows (``views.device``), the views rendered from them (``sizes``: global and local side, from the config)."""
    if "pages" not in batch:
        return normalize_crops(batch["global_crops"]), normalize_crops(batch["local_crops"])
    if sizes is None:
        raise ValueError("a batch of pages and crop rows needs the views' sizes (a config with a views section)")
    with record_function("gsdistill.views"):  # the augmentation's share of a profiled step
        rows = page_rows(batch["pages"])
        glob = render_views(rows, batch["global_params"], sizes[0])
        local = render_views(rows, batch["local_params"], sizes[1]) if batch["local_params"].shape[0] else \
            rows.new_zeros(0, 3, sizes[1], sizes[1], dtype=torch.float32)
        return scale_pixels(glob), scale_pixels(local)


def normalize_crops(crops: torch.Tensor) -> torch.Tensor:
    """``uint8 [N,3,H,W]`` pixels -> float32 ``(x / 255 - mean) / std``; float crops (already
    normalised, e.g. benchmarks' random batches) are returned unchanged."""
    if crops.dtype != torch.uint8:
        return crops
    return scale_pixels(crops.float())


def scale_pixels(pixels: torch.Tensor) -> torch.Tensor:
    """float32 pixels in ``[0, 255]`` -> ``(x / 255 - mean) / std``."""
    mean = torch.tensor(IMAGENET_MEAN, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=pixels.device).view(1, 3, 1, 1)
    # one fused multiply-add: x * (1 / (255 std)) - mean / std
    return torch.addcmul((-mean / std).expand(pixels.shape), pixels, (1.0 / (255.0 * std)).expand(pixels.shape))


def masked_view_index(masks: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of ``masks: bool[V, P]`` with at least one masked patch, ascending. ``index``: the same,
    computed on the host by the data pipeline (``batch["masked_views"]``), which spares the ``nonzero``."""
    if index is not None:
        return index.to(masks.device, non_blocking=True)
    return masks.any(dim=1).nonzero()[:, 0]


def with_unmasked_copies(views: torch.Tensor, masks: torch.Tensor | None,
                         copies: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(views, masks)`` extended by the views at ``copies`` again, with no mask."""
    if masks is None or copies is None or copies.numel() == 0:
        return views, masks
    masks = masks.to(views.device)
    return (torch.cat([views, views.index_select(0, copies)]),
            torch.cat([masks, masks.new_zeros(copies.shape[0], masks.shape[1])]))


def whole_view_rows(n_views: int, copies: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Row of each global view's whole (unmasked) features in the extended call of
    :func:`with_unmasked_copies`: its copy where it was masked, itself otherwise. ``valid``: False for
    padding copies (a batch's fixed shapes, ``gsdistill.views.fixed_shapes``), which redirect nothing."""
    rows = torch.arange(n_views, device=copies.device)
    copy_rows = n_views + torch.arange(copies.shape[0], device=copies.device)
    if valid is None:
        return rows.index_copy(0, copies, copy_rows)
    # a padding copy repeats some view, maybe a masked one: it offers row 0, below any row, and the max wins
    offered = torch.where(valid.to(copies.device), copy_rows, torch.zeros_like(copy_rows))
    return rows.scatter_reduce(0, copies, offered, "amax")
