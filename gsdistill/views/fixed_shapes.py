"""Fixed batch shapes for a run: every count that varies between batches padded to a bound set at the start.

A compiled step (``train.compile``) specialises on every tensor size it sees, and a size it has not seen
compiles the step again (85.8 s on an H200 when ``sem_emb`` went from 32 to 29 span rows: issue 57).
What varies, and the bound it is padded to (:func:`run_shapes`):

- texts per page (``sem_emb`` / ``sem_valid`` rows, ``local_span_mask``'s last axis) and boxes per page
  (``geom_emb`` / ``geom_valid`` rows, ``region_pool`` rows): ``views.max_spans``, which the views keep at
  most of either, lowered to the shards' per-page maxima where their manifest records them
  (``max_spans_per_page``, ``max_boxes_per_page``; today's manifests hold totals only);
- the iBOT-masked views of a batch (``masked_views``: the unmasked copies the alignment heads read, so rows
  of the student's global pass) and their masked patches (``mask_index``: rows of the iBOT head, its
  teacher targets and its loss): the stream masks exactly ``masked_view_count`` views at stratified shares
  (``gsdistill.views.masking.batch_masks``, DINOv2's collate), so the config alone bounds both, tightly.

Padding is inert: padded text and box rows are invalid (``*_valid`` False, zero pooling rows, shown by no
local view), padded iBOT rows are flagged by ``mask_valid`` (no weight in the loss, no mass in the
teacher's Sinkhorn-Knopp or centre), padded copies by ``masked_views_valid`` (their features are never
read): every loss term equals the unpadded batch's (``tests/test_pretrain_fixed_shapes.py``).
A batch over a bound (a manifest that undercounts, a batch made elsewhere) is cut to it and never
crashes: texts and boxes past it are dropped (as ``views.max_spans`` drops them), masked views past it
are left whole (unmasked: every kept view's term is as before), and :func:`pad_batch` returns the counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gsdistill.views.masking import masked_patch_bound, masked_view_count

MASK_KEYS = ("mask_index", "mask_valid", "masked_views", "masked_views_valid")
TEXT_KEYS = {"texts": ("sem_emb", "sem_valid"), "boxes": ("geom_emb", "geom_valid")}


@dataclass(frozen=True)
class BatchShapes:
    """Rows per page of texts and boxes; masked views and masked patches per (rank-local) batch."""

    texts: int
    boxes: int
    masked_views: int
    masked_patches: int

    def cover(self, other: "BatchShapes") -> "BatchShapes":
        """The smallest shapes that hold both."""
        return BatchShapes(*(max(a, b) for a, b in zip(vars(self).values(), vars(other).values())))


def run_shapes(cfg, local_batch: int, grid: tuple[int, int], manifest: dict | None = None) -> BatchShapes:
    """The bounds of a run's batches of ``local_batch`` pages (module doc); ``grid``: patches of a global view."""
    v = cfg["views"]
    spans = int(v["max_spans"])
    manifest = manifest or {}
    n_views, prob, ratio = int(v["n_global"]) * local_batch, float(v["mask_prob"]), tuple(v["mask_ratio"])
    return BatchShapes(texts=max(1, min(spans, int(manifest.get("max_spans_per_page", spans)))),
                       boxes=max(1, min(spans, int(manifest.get("max_boxes_per_page", spans)))),
                       masked_views=masked_view_count(n_views, prob),
                       masked_patches=masked_patch_bound(n_views, grid, prob, ratio))


def batch_shapes(batch: dict) -> BatchShapes | None:
    """The shapes a collated batch holds as it is (None for a batch without iBOT masks: not a pretraining batch)."""
    if not isinstance(batch.get("masks"), torch.Tensor):
        return None
    masks = batch["masks"]
    return BatchShapes(texts=int(batch["sem_emb"].shape[1]) if "sem_emb" in batch else 1,
                       boxes=int(batch["geom_emb"].shape[1]) if "geom_emb" in batch else 1,
                       masked_views=int(masks.any(1).sum()), masked_patches=int(masks.sum()))


def covering_shapes(batches: list[dict]) -> BatchShapes | None:
    """The smallest shapes that hold every batch of ``batches`` (None when none is a pretraining batch)."""
    found = [s for s in map(batch_shapes, batches) if s is not None]
    shapes = found[0] if found else None
    for s in found[1:]:
        shapes = shapes.cover(s)
    return shapes


def shard_manifest(shard_dir: str | Path) -> dict | None:
    """A shard dir's manifest, for the per-page maxima it may record (None without one)."""
    from gsdistill.tuples.store.reader import read_manifest
    from gsdistill.tuples.store.writer import MANIFEST

    return read_manifest(shard_dir) if (Path(shard_dir) / MANIFEST).is_file() else None


def _fit_rows(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``x`` cut or zero-padded (False for bool) to ``size`` along ``dim``."""
    if x.shape[dim] >= size:
        return x.narrow(dim, 0, size)
    pad = list(x.shape)
    pad[dim] = size - x.shape[dim]
    return torch.cat([x, x.new_zeros(pad)], dim)


def _fit_masks(masks: torch.Tensor, shapes: BatchShapes) -> tuple[torch.Tensor, int]:
    """``masks`` with the last masked views left whole until both iBOT counts fit; (masks, views unmasked)."""
    per_view = masks.sum(1)
    masked = per_view.nonzero()[:, 0]
    fits = int((per_view[masked].cumsum(0) <= shapes.masked_patches).sum())
    keep = min(fits, shapes.masked_views)
    if keep == masked.numel():
        return masks, 0
    masks = masks.clone()
    masks[masked[keep:]] = False
    return masks, int(masked.numel() - keep)


def padded_host_indices(masks: torch.Tensor, shapes: BatchShapes) -> dict:
    """The iBOT masks' flat indices and masked-view rows (``host_indices``), padded to ``shapes`` with index 0,
    with validity flags. ``masks`` must fit ``shapes`` (:func:`pad_batch` makes them fit)."""
    index, views = masks.flatten().nonzero()[:, 0], masks.any(dim=1).nonzero()[:, 0]
    if index.numel() > shapes.masked_patches or views.numel() > shapes.masked_views:
        raise ValueError(f"{views.numel()} masked views / {index.numel()} masked patches exceed the bounds {shapes}")
    return {"mask_index": _fit_rows(index, 0, shapes.masked_patches),
            "mask_valid": torch.arange(shapes.masked_patches) < index.numel(),
            "masked_views": _fit_rows(views, 0, shapes.masked_views),
            "masked_views_valid": torch.arange(shapes.masked_views) < views.numel()}


def pad_batch(batch: dict, shapes: BatchShapes) -> tuple[dict, dict[str, int]]:
    """A collated batch (``collate_pretrain``'s layout, on the host) padded, or cut, to ``shapes``, with the
    iBOT host indices padded; and what was cut: ``{"texts", "boxes"}`` (valid rows dropped) and
    ``"masked_views"`` (views unmasked)."""
    out, cut = dict(batch), {}
    for name, (emb, valid) in TEXT_KEYS.items():
        if emb not in out:
            continue
        size = getattr(shapes, name)
        cut[name] = int(out[valid][:, size:].sum())
        out[emb], out[valid] = _fit_rows(out[emb], 1, size), _fit_rows(out[valid], 1, size)
    if "local_span_mask" in out:  # [B, n_local, texts]
        out["local_span_mask"] = _fit_rows(out["local_span_mask"], 2, shapes.texts)
    if "region_pool" in out:  # [views, boxes, cells]
        out["region_pool"] = _fit_rows(out["region_pool"], 1, shapes.boxes)
    out["masks"], cut["masked_views"] = _fit_masks(out["masks"], shapes)
    out.update(padded_host_indices(out["masks"], shapes))
    return out, cut
