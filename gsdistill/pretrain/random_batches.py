"""Batches of random tensors shaped as the views pipeline collates them: benchmarks and engine tests.

:func:`tensor_batch` is a ``collate_pretrain``-shaped batch (normalised image noise, unit text embeddings,
padded span lists) with iBOT masks drawn as the views pipeline draws them (:func:`ibot_masks`).
"""
from __future__ import annotations

import numpy as np
import torch

from gsdistill.views.masking import view_mask


def ibot_masks(views, n_views: int, grid: tuple[int, int], seed: int = 0, mean: bool = False) -> torch.Tensor:
    """``bool[n_views, h*w]`` iBOT masks as the views pipeline draws them (``view_mask``: each view
    masked with ``views.mask_prob``, a block mask over a share drawn from ``views.mask_ratio``).
    ``mean=True``: the average batch instead of a draw -- exactly ``round(mask_prob * n_views)`` views
    masked, each at the middle of ``mask_ratio``. A step's FLOPs are linear in the masked views and
    their masked patches, so this batch counts the expected FLOPs of a training step (gpu_check's
    share of the peak), where a 2-page draw masks anywhere from 0 to 4 of its views."""
    rng = np.random.default_rng(seed)
    prob, ratio = float(views["mask_prob"]), tuple(float(r) for r in views["mask_ratio"])
    if not mean:
        return torch.stack([torch.from_numpy(view_mask(grid, prob, ratio, rng)) for _ in range(n_views)])
    masks = torch.zeros(n_views, grid[0] * grid[1], dtype=torch.bool)
    share = (ratio[0] + ratio[1]) / 2
    for i in range(int(round(prob * n_views))):
        masks[i] = torch.from_numpy(view_mask(grid, 1.0, (share, share), rng))
    return masks


def tensor_batch(cfg, n_pages: int, seed: int = 0, n_texts: int = 6, patch_size: int = 16,
                 mean_masks: bool = False) -> dict:
    """A ``collate_pretrain``-shaped batch of random tensors (benchmarks, engine tests): normalised
    image noise, random unit text embeddings, padded span lists, iBOT masks drawn as the views
    pipeline draws them (:func:`ibot_masks`; ``mean_masks``: the average masking)."""
    v, text_dim = cfg["views"], int(cfg["model"]["text_dim"])
    g = torch.Generator().manual_seed(seed)
    ng, nl, gs, ls = int(v["n_global"]), int(v["n_local"]), int(v["global_size"]), int(v["local_size"])
    masks = ibot_masks(v, ng * n_pages, (gs // patch_size, gs // patch_size), seed, mean=mean_masks)

    def unit(*shape):
        return torch.nn.functional.normalize(torch.randn(*shape, generator=g), dim=-1)

    sem_valid = torch.arange(n_texts)[None, :] < torch.randint(1, n_texts + 1, (n_pages, 1), generator=g)
    geom_valid = torch.arange(n_texts)[None, :] < torch.randint(1, n_texts + 1, (n_pages, 1), generator=g)
    batch = {"global_crops": torch.randn(ng * n_pages, 3, gs, gs, generator=g),
             "local_crops": torch.randn(nl * n_pages, 3, ls, ls, generator=g), "masks": masks,
             "sem_emb": unit(n_pages, n_texts, text_dim), "sem_valid": sem_valid,
             "geom_emb": unit(n_pages, n_texts, text_dim), "geom_valid": geom_valid,
             "sp_sem_emb": unit(n_pages, text_dim), "sp_geom_emb": unit(n_pages, text_dim),
             "sp_joint_emb": unit(n_pages, text_dim), "ids": [f"page-{seed}-{i}" for i in range(n_pages)]}
    if cfg["objective"].get("region_geom", False):  # each valid box covers a random third of the cells
        cells = (torch.rand(ng * n_pages, n_texts, (gs // patch_size) ** 2, generator=g) < 0.3).float()
        cells[..., 0] = 1.0
        cells = cells * geom_valid.repeat(ng, 1)[..., None]
        batch["region_pool"] = cells / cells.sum(-1, keepdim=True).clamp_min(1.0)
    return batch
