"""The inference API of a pretrained GSDistill model: page and text embeddings through its heads.

Used by ``gsdistill.eval`` and ``gsdistill.pretrain.checkpoint.load_model``; a mixin of
:class:`gsdistill.models.gsdistill_model.GSDistill`, which holds the backbone, the alignment heads
(``align``), their pooling grids (``pool_grid``) and the patch size.
"""
from __future__ import annotations

import torch

from gsdistill.models.vit_encoder import encode_views, grid_pool


class PageEmbeddings:
    def page_features(self, images: torch.Tensor) -> torch.Tensor:
        """Mean-pooled page embedding ``h_p [B, C]`` of the student backbone."""
        return encode_views(self.backbone, images)[0]

    def head_inputs(self, h_p: torch.Tensor, patches: torch.Tensor | None, image_hw, name: str) -> torch.Tensor:
        """What head ``name`` reads: ``h_p`` or its grid-pooled patch tokens (``model.*_pool_grid``)."""
        grid = self.pool_grid[name]
        return h_p if grid <= 0 else grid_pool(patches, tuple(image_hw), self.patch_size, grid)

    def page_head_for(self, kind: str) -> str:
        """Name of the head that serves ``kind`` = "semantic" or "geometric" retrieval.

        "semantic" -> ``sem``; on a joint-head model (``objective.heads=joint``) -> ``joint``, the
        one head trained on spans and box descriptors together, so it is the semantic head too.
        "geometric" -> ``geom``; a model without that head (semantic-only or joint) raises.
        """
        if kind not in ("semantic", "geometric"):
            raise ValueError(f"kind must be 'semantic' or 'geometric', got {kind!r}")
        name = "geom" if kind == "geometric" else ("joint" if "joint" in self.align else "sem")
        if name not in self.align:
            raise ValueError(f"this model has no {name!r} head for {kind} retrieval (heads: {sorted(self.align)})")
        return name

    def _embed(self, images: torch.Tensor, kind: str) -> torch.Tensor:
        name = self.page_head_for(kind)
        h_p, patches = encode_views(self.backbone, images, with_patches=self.pool_grid[name] > 0)
        return self.align[name].embed_pages(self.head_inputs(h_p, patches, images.shape[-2:], name))

    def embed_pages(self, images: torch.Tensor) -> torch.Tensor:
        """``float[B,3,H,W] -> float[B, proj_dim]``, semantic head (joint head on a joint model), L2-normalised."""
        return self._embed(images, "semantic")

    def embed_pages_geom(self, images: torch.Tensor) -> torch.Tensor:
        return self._embed(images, "geometric")

    def embed_text_sem(self, text_emb: torch.Tensor) -> torch.Tensor:
        """Frozen-encoder embeddings ``[M, D_text] -> [M, proj_dim]`` (L2-normalised), semantic head
        (joint head on a joint model)."""
        return self.align[self.page_head_for("semantic")].embed_text(text_emb)

    def embed_text_geom(self, text_emb: torch.Tensor) -> torch.Tensor:
        return self.align[self.page_head_for("geometric")].embed_text(text_emb)

