"""Run a timm ViT on a batch of views with optional iBOT masking; return ``h_p`` and patch tokens.

The backbone is always called as a module (``backbone(x)``), never through its internal methods,
so DeepSpeed ZeRO-3 (which gathers a module's partitioned weights in its forward hooks) sees every
parameter, including the ViT's own ``cls_token`` / ``pos_embed``. Two forward hooks, installed once
per backbone (:func:`install_view_hooks`), do the rest, reading what this call asks for from a small
state object on the backbone:

- on ``patch_embed``: replace masked patch embeddings by the learnable mask token (iBOT / DINOv2:
  before the position embedding is added, so a masked patch keeps its position);
- on ``norm`` (the identity when ``global_pool='avg'``): keep the token sequence, whose patch part
  (after the ViT's ``fc_norm``) feeds the iBOT head.

Installed once, not added and removed around each call: ``torch.compile`` traces the whole step
through them without a graph break (a hook registered inside a compiled region breaks the graph).

``h_p`` is timm's own mean pooling over patch tokens followed by ``fc_norm`` (Table A2: mean pooling).
"""
from __future__ import annotations

import torch
from torch import nn


class _ViewState:
    """What the next ``backbone(images)`` call should do: masks to apply, tokens to keep."""

    def __init__(self) -> None:
        self.masks: torch.Tensor | None = None
        self.mask_token: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None


def _apply_mask(module: nn.Module, _inputs, out: torch.Tensor) -> torch.Tensor:
    state = module._gsdistill_views
    if state.masks is None:
        return out
    # out: [B, H, W, C] (dynamic_img_size keeps the grid) or [B, P, C]
    flat_mask = state.masks.reshape(out.shape[:-1]).unsqueeze(-1)
    return torch.where(flat_mask, state.mask_token.to(out.dtype).expand_as(out), out)


def _keep_tokens(module: nn.Module, _inputs, out: torch.Tensor) -> None:
    module._gsdistill_views.tokens = out


def install_view_hooks(backbone: nn.Module) -> _ViewState:
    """The backbone's view state, with its two hooks registered on first use. The hooks are plain
    functions that find the state on the module they run on, so a ``deepcopy`` of the backbone (the
    EMA teacher) gets its own state and hooks that read it."""
    state = getattr(backbone.patch_embed, "_gsdistill_views", None)
    if state is not None:
        return state
    state = _ViewState()
    for module, hook in ((backbone.patch_embed, _apply_mask), (backbone.norm, _keep_tokens)):
        object.__setattr__(module, "_gsdistill_views", state)  # a plain attribute: no state_dict entry
        module.register_forward_hook(hook)
    return state


def encode_views(backbone: nn.Module, images: torch.Tensor, masks: torch.Tensor | None = None,
                 mask_token: torch.Tensor | None = None,
                 with_patches: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``images [N,3,H,W]`` (+ ``masks bool[N, P]``) -> ``(h_p [N, C], patch tokens [N, P, C] | None)``."""
    if images.shape[0] == 0:
        dim = int(backbone.embed_dim)
        return images.new_zeros(0, dim), (images.new_zeros(0, 0, dim) if with_patches else None)
    if masks is not None:
        if mask_token is None:
            raise ValueError("iBOT masks were given but the model has no mask token (ibot disabled)")
        grid = (images.shape[-2] // backbone.patch_embed.patch_size[0]) * \
               (images.shape[-1] // backbone.patch_embed.patch_size[1])
        if masks.shape != (images.shape[0], grid):
            raise ValueError(f"masks shape {tuple(masks.shape)} does not fit images {tuple(images.shape)} "
                             f"(expected ({images.shape[0]}, {grid}))")
    state = install_view_hooks(backbone)
    state.masks, state.mask_token = masks, mask_token
    try:
        pooled = backbone(images)
        tokens = state.tokens
    finally:
        state.masks, state.mask_token, state.tokens = None, None, None
    patches = None
    if with_patches:
        patches = backbone.fc_norm(tokens[:, backbone.num_prefix_tokens:])
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
