"""``collate_pretrain``: samples of the views pipeline -> the view-major batch the model consumes.

Every page's view 0, then every page's view 1, ... (:meth:`gsdistill.models.gsdistill_model.GSDistill.forward`);
``local_span_mask`` alone is page-major, ``bool[B, n_local, S]``; ``region_pool`` is view-major like the
crops, ``float[n_global * B, S, P]`` over ``geom_emb``'s padded rows. A view is either its pixels
(``global_crops`` / ``local_crops``, ``uint8 [3, size, size]``: ``MultiCropViews``) or, when the views are
made in the training step (``views.device``: ``gsdistill.views.batched_views``), the parameters of its crop
(``global_params`` / ``local_params``, ``float32 [CROP_COLUMNS]``) beside its page, sent once:
``pages uint8 [B, H, W, 3]`` (RGB, padded to the run's canvas) and ``page_hw`` (each page's true size).
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import get_worker_info


def page_batch(samples: list[dict]) -> torch.Tensor:
    """``uint8 [B, H, W, 3]``: the samples' pages written once onto the canvas, the rest zero. In a DataLoader
    worker the tensor lives in shared memory from the start (as torch's ``default_collate`` does), so the
    batch crosses to the training process without another copy of its ~1 MB a page."""
    shape = (len(samples), *samples[0]["canvas"], 3)
    if get_worker_info() is not None:
        storage = torch.empty(0, dtype=torch.uint8)._typed_storage()._new_shared(int(np.prod(shape)))
        pages = torch.empty(0, dtype=torch.uint8).new(storage).view(shape)
    else:
        pages = torch.empty(shape, dtype=torch.uint8)
    out = pages.numpy()
    for i, s in enumerate(samples):
        h, w = s["page"].shape[:2]
        out[i, :h, :w] = s["page"]
        out[i, h:], out[i, :h, w:] = 0, 0
    return pages


def _pad(rows: list[np.ndarray], dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(1, max(len(r) for r in rows))
    out = torch.zeros(len(rows), longest, dim)
    valid = torch.zeros(len(rows), longest, dtype=torch.bool)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.from_numpy(r)
            valid[i, : len(r)] = True
    return out, valid


def _views(samples: list[dict]) -> tuple[dict, int, int]:
    """The batch's views, view-major (crops, or pages and crop parameters), and the views per page."""
    kind = "params" if "page" in samples[0] else "crops"
    first_global, first_local = samples[0][f"global_{kind}"], samples[0][f"local_{kind}"]
    n_g, n_l = len(first_global), len(first_local)
    out = {f"global_{kind}": torch.stack([s[f"global_{kind}"][v] for v in range(n_g) for s in samples])}
    if n_l:
        out[f"local_{kind}"] = torch.stack([s[f"local_{kind}"][v] for v in range(n_l) for s in samples])
    else:  # an empty tensor of the global views' kind
        out[f"local_{kind}"] = torch.zeros(0, *first_global[0].shape, dtype=first_global[0].dtype)
    if kind == "params":
        out["pages"] = page_batch(samples)
        out["page_hw"] = torch.tensor([list(s["page_hw"]) for s in samples], dtype=torch.int32)
    return out, n_g, n_l


def collate_pretrain(samples: list[dict], masks: torch.Tensor | None = None) -> dict:
    """View-major batch (see module docstring). Pages need cached embeddings (``gsdistill tuples embed``).
    ``masks``: the batch's iBOT masks ``bool[n_global * B, P]`` (``batch_masks``), else the samples' own."""
    if not samples:
        raise ValueError("collate_pretrain got an empty batch")
    missing = [s["id"] for s in samples if "sem_emb" not in s or "geom_emb" not in s]
    if missing:
        raise ValueError(f"pages {missing[:3]} have no cached text embeddings; run "
                         "'gsdistill tuples embed SHARD_DIR' (gsdistill.tuples.embedding.stage.embed_shards) first and read the "
                         "pages with ShardDataset(..., embeddings=text_cache.open_embeddings(SHARD_DIR))")
    batch, n_g, n_l = _views(samples)
    batch["masks"] = masks if masks is not None else torch.stack([s["masks"][v] for v in range(n_g) for s in samples])
    dim = samples[0]["sem_emb"].shape[-1] if len(samples[0]["sem_emb"].shape) == 2 else 0
    dim = dim or int(samples[0]["sp_sem_emb"].shape[-1])
    batch["sem_emb"], batch["sem_valid"] = _pad([s["sem_emb"].reshape(-1, dim) for s in samples], dim)
    batch["geom_emb"], batch["geom_valid"] = _pad([s["geom_emb"].reshape(-1, dim) for s in samples], dim)
    for key in ("sp_sem_emb", "sp_geom_emb", "sp_joint_emb"):
        if all(key in s for s in samples):
            batch[key] = torch.stack([torch.from_numpy(s[key]) for s in samples])
    if n_l and all("local_span_mask" in s for s in samples):
        # page-major [B, n_local, S] (S = sem_emb's padded width), so a rank's slice is its pages' rows
        shown = torch.zeros(len(samples), n_l, batch["sem_emb"].shape[1], dtype=torch.bool)
        for i, s in enumerate(samples):
            for v, m in enumerate(s["local_span_mask"]):
                shown[i, v, :len(m)] = torch.from_numpy(m)
        batch["local_span_mask"] = shown
    if all("region_pool" in s for s in samples):
        width, cells = batch["geom_emb"].shape[1], samples[0]["region_pool"][0].shape[1]
        pool = torch.zeros(n_g * len(samples), width, cells)
        for v in range(n_g):
            for i, s in enumerate(samples):
                rows = s["region_pool"][v]
                pool[v * len(samples) + i, :len(rows)] = torch.from_numpy(rows)
        batch["region_pool"] = pool
    batch["ids"] = [s["id"] for s in samples]
    return batch
