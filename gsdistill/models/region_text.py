"""The region term (``objective.region_geom``): the patch tokens inside each layout box aligned with that box's descriptor.

The paper's geometric head aligns a whole page view with the descriptors of its boxes (paper 003
§4.2); nothing asks the patch tokens under a box to say what the box is, and the detector reads
those tokens. Here each layout box ``b`` visible in a whole global view ``v`` is an anchor: its
region feature is the area-weighted mean of the student's patch tokens the box covers,
``r_vb = sum_k w_vbk x_vk`` (``batch["region_pool"]``, :mod:`gsdistill.views.region_pool`), projected
by the region head (``align["region"]``: its own projection and text projection); its one positive
is the box's own descriptor ``t_b`` (class, position, page context: the same cached embedding the
geometric head reads), its negatives every other descriptor of every page of the (gathered) batch:

    L_region_geom = mean_{(v, b) visible} -log( exp(s <z_vb, t_b>) / sum_{j valid} exp(s <z_vb, t_j>) )

(the head's multi-positive loss with one positive is this InfoNCE). It reuses the global pass the
alignment heads read, so no backbone pass is added; the pooling is one ``bmm`` of
``[V*B, S, P] x [V*B, P, C]``.
"""
from __future__ import annotations

import torch


def region_features(patches: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """``patches [N, P, C]``, ``pool [N, S, P]`` -> ``[N, S, C]``: each box's area-weighted mean token."""
    if pool.shape[0] != patches.shape[0] or pool.shape[2] != patches.shape[1]:
        raise ValueError(f"region_pool {tuple(pool.shape)} must be [N, S, P] for patch tokens {tuple(patches.shape)}")
    return torch.bmm(pool.to(patches.dtype), patches)


def region_geom_term(head, patches: torch.Tensor, batch: dict, n_pages: int, text_width: int | None,
                     view_valid: torch.Tensor | None = None) -> torch.Tensor:
    """``L_region_geom`` (module doc) with ``head`` (a ``PageTextAlignment``) over the whole global views'
    patch tokens ``patches [V*B, P, C]`` (view-major, as the crops); ``view_valid bool[V*B]``: views the
    alignment heads may read (``objective.align_views: visible``), all when None."""
    if "region_pool" not in batch:
        raise KeyError("objective.region_geom needs batch['region_pool'] (which patches each layout box covers): "
                       "the views pipeline makes it with MultiCropViews(region_boxes=True)")
    pool = batch["region_pool"].to(patches.device, non_blocking=True)
    text, valid = batch["geom_emb"], batch["geom_valid"]
    n_views, width = pool.shape[0], pool.shape[1]
    if width != text.shape[1]:
        raise ValueError(f"region_pool has {width} box rows but geom_emb {text.shape[1]}: both come from one collate")
    feats = region_features(patches, pool).flatten(0, 1)  # [V*B*S, C], row (view, box)
    view_page = torch.arange(n_pages, device=patches.device).repeat(n_views // n_pages)
    anchor_page = view_page.repeat_interleave(width)
    present = pool.sum(-1) > 0  # a box the crop cut away has a zero row
    if view_valid is not None:
        present = present & view_valid.to(present.device).unsqueeze(1)
    own = torch.eye(width, dtype=torch.bool, device=patches.device).repeat(n_views, 1)  # [V*B*S, S]
    loss, _ = head(feats, anchor_page, text, valid, anchor_valid=present.flatten(), text_width=text_width,
                   text_positives=own)
    return loss
