"""sentence-transformers' own ``MultipleNegativesRankingLoss`` as a reference row of the table.

The loss value comes from ``MultipleNegativesRankingLoss.compute_loss_from_embeddings`` of the
installed sentence-transformers (its code, not a re-implementation): each query against every
positive and every hard negative of the batch, ``cross_entropy(scale * cos(q, [P; N]), diag)``.
The training loop, optimiser, data, mined negatives and frozen passage cache are the project's, so
the comparison differs in the loss only. Use groups of G = 2, M = 1: column 0 of each group is the
positive, column 1 the (mined) hard negative -- ST's (anchor, positive, negative) triplets.
"""
from __future__ import annotations

import torch
from torch import nn


class SentenceTransformersMNRL(nn.Module):
    """``forward(q_emb [B, D], p_emb [2B, D]) -> scalar``; ``scale`` = 1 / temperature (ST default 20)."""

    def __init__(self, scale: float = 20.0) -> None:
        super().__init__()
        try:
            from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        except ImportError:
            try:
                from sentence_transformers.losses import MultipleNegativesRankingLoss
            except ImportError:
                raise RuntimeError("loss st_mnrl needs sentence-transformers (pip install -e .[dev])") from None
        self.mnrl = MultipleNegativesRankingLoss(model=None, scale=scale)
        self.last_stats: dict = {}

    def forward(self, q_emb: torch.Tensor, p_emb: torch.Tensor) -> torch.Tensor:
        if p_emb.shape[0] != 2 * q_emb.shape[0]:
            raise ValueError(f"st_mnrl needs groups of 2 passages (groups.size=2, groups.max_positives=1), "
                             f"got {p_emb.shape[0]} passages for {q_emb.shape[0]} queries")
        self.last_stats = {"anchors_used": q_emb.shape[0]}
        return self.mnrl.compute_loss_from_embeddings([q_emb, p_emb[0::2], p_emb[1::2]], None)


EXTRA_LOSSES = {"st_mnrl": SentenceTransformersMNRL}
