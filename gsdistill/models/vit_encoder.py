"""Run a timm ViT on a batch of views with optional iBOT masking; return ``h_p`` and patch tokens.

The backbone is always called as a module (``backbone(x)``), never through its internal methods,
so DeepSpeed ZeRO-3 (which gathers a module's partitioned weights in its forward hooks) sees every
parameter, including the ViT's own ``cls_token`` / ``pos_embed``. Two temporary forward hooks do
the rest:

- on ``patch_embed``: replace masked patch embeddings by the learnable mask token (iBOT / DINOv2:
  before the position embedding is added, so a masked patch keeps its position);
- on ``norm`` (the identity when ``global_pool='avg'``): keep the token sequence, whose patch part
  (after the ViT's ``fc_norm``) feeds the iBOT head.

``h_p`` is timm's own mean pooling over patch tokens followed by ``fc_norm`` (Table A2: mean pooling).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn


@contextmanager
def _hooks(backbone: nn.Module, masks: torch.Tensor | None, mask_token: torch.Tensor | None,
           store: dict) -> Iterator[None]:
    handles = []

    def apply_mask(_module, _inputs, out):
        # out: [B, H, W, C] (dynamic_img_size keeps the grid) or [B, P, C]
        flat_mask = masks.reshape(out.shape[:-1]).unsqueeze(-1)
        return torch.where(flat_mask, mask_token.to(out.dtype).expand_as(out), out)

    def keep_tokens(_module, _inputs, out):
        store["tokens"] = out

    if masks is not None:
        if mask_token is None:
            raise ValueError("iBOT masks were given but the model has no mask token (ibot disabled)")
        handles.append(backbone.patch_embed.register_forward_hook(apply_mask))
    handles.append(backbone.norm.register_forward_hook(keep_tokens))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def encode_views(backbone: nn.Module, images: torch.Tensor, masks: torch.Tensor | None = None,
                 mask_token: torch.Tensor | None = None,
                 with_patches: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``images [N,3,H,W]`` (+ ``masks bool[N, P]``) -> ``(h_p [N, C], patch tokens [N, P, C] | None)``."""
    if images.shape[0] == 0:
        dim = int(backbone.embed_dim)
        return images.new_zeros(0, dim), (images.new_zeros(0, 0, dim) if with_patches else None)
    if masks is not None:
        grid = (images.shape[-2] // backbone.patch_embed.patch_size[0]) * \
               (images.shape[-1] // backbone.patch_embed.patch_size[1])
        if masks.shape != (images.shape[0], grid):
            raise ValueError(f"masks shape {tuple(masks.shape)} does not fit images {tuple(images.shape)} "
                             f"(expected ({images.shape[0]}, {grid}))")
    store: dict = {}
    with _hooks(backbone, masks, mask_token, store):
        pooled = backbone(images)
    patches = None
    if with_patches:
        tokens = store["tokens"][:, backbone.num_prefix_tokens:]
        patches = backbone.fc_norm(tokens)
    return pooled, patches


def grid_pool(patches: torch.Tensor, image_hw: tuple[int, int], patch_size: int, grid: int) -> torch.Tensor:
    """``patches [N, P, C]`` of ``image_hw`` views -> ``[N, grid*grid*C]``: the patch-token map
    average-pooled to a ``grid x grid`` layout and flattened (row-major), so a linear head sees *where*
    things are. A mean over all patches (``h_p``) keeps what is on the page but mixes away where."""
    n, p, c = patches.shape
    h, w = image_hw[0] // patch_size, image_hw[1] // patch_size
    if h * w != p:
        raise ValueError(f"{p} patch tokens do not form the {h}x{w} grid of {image_hw} views")
    fmap = patches.transpose(1, 2).reshape(n, c, h, w)
    return torch.nn.functional.adaptive_avg_pool2d(fmap, grid).permute(0, 2, 3, 1).reshape(n, grid * grid * c)
