"""Page-text alignment for one head (semantic, geometric or joint): paper 003 §4.1-4.2.

Anchors are the page embeddings ``z_p = normalize(head(h_p))`` of this rank's views; candidates are
the projected texts ``t = normalize(proj(e))`` of every page of every rank (``gather_with_grad``),
plus, optionally, a memory bank of recent text embeddings. A page's own spans (or box descriptors)
are its positives; everything else is a negative:

    L = mean_p  -log( sum_{i in P(p)} exp(s * <z_p, t_i>) / sum_{j valid} exp(s * <z_p, t_j>) )

(``SumMargLH`` = MPCL by default; any multi-positive loss of the registry can be named). With one
text per page (SP mode) the same code is CLIP-style InfoNCE.

The memory bank stores the frozen encoder's RAW embeddings, not projected ones: the text encoder
never changes, so a queued entry is projected with the current projection each step and is never
stale (unlike a MoCo queue of outputs). It is a ring buffer saved with the model state.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from gsdistill.losses import LogitScale, gather_with_grad, get_loss, rank_offset
from gsdistill.losses.gather import is_distributed
from gsdistill.models.heads import ProjectionHead, TextProjection


def _global_max(n: int, device: torch.device) -> int:
    if not is_distributed():
        return n
    t = torch.tensor([n], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


class PageTextAlignment(nn.Module):
    """One contrastive head: ``forward(h_p [A,C], anchor_page long[A], text [B,S,Dt], valid bool[B,S])``
    -> ``(loss scalar, z_p [A, proj_dim] L2-normalised)``; ``anchor_page`` indexes this rank's B pages."""

    def __init__(self, embed_dim: int, text_dim: int, proj_dim: int = 256, head_hidden_dim: int = 0,
                 loss: str = "sum_marg_lh", init_temperature: float = 0.07, learnable_scale: bool = True,
                 max_scale: float = 100.0, queue_size: int = 0, symmetric: bool = False):
        super().__init__()
        self.symmetric = bool(symmetric)
        self.head = ProjectionHead(embed_dim, proj_dim, head_hidden_dim)
        self.text_proj = TextProjection(text_dim, proj_dim)
        self.logit_scale = LogitScale(init_temperature, learnable_scale, max_scale)
        if isinstance(self.logit_scale.log_scale, nn.Parameter) and self.logit_scale.log_scale.dim() == 0:
            # DeepSpeed broadcasts parameters as byte views, which 0-dim tensors cannot give: shape [1]
            self.logit_scale.log_scale = nn.Parameter(self.logit_scale.log_scale.detach().reshape(1))
        self.loss = get_loss(loss)
        self.queue_size = int(queue_size)
        self.register_buffer("queue", torch.zeros(self.queue_size, text_dim))
        self.register_buffer("queue_valid", torch.zeros(self.queue_size, dtype=torch.bool))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))

    def embed_pages(self, h_p: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.head(h_p), dim=-1)

    def embed_text(self, text_emb: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.text_proj(text_emb), dim=-1)

    def forward(self, h_p: torch.Tensor, anchor_page: torch.Tensor, text: torch.Tensor,
                valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if text.dim() != 3 or valid.shape != text.shape[:2]:
            raise ValueError(f"text {tuple(text.shape)} must be [B, S, D] with valid [B, S], got {tuple(valid.shape)}")
        if text.shape[-1] != self.text_proj.proj.in_features:
            raise ValueError(f"cached text embeddings have {text.shape[-1]} dims but model.text_dim is "
                             f"{self.text_proj.proj.in_features}: set model.text_dim (and model.text_encoder) "
                             "to the encoder the cache was built with")
        n_pages, n_texts = text.shape[:2]
        width = _global_max(n_texts, text.device)  # all_gather needs the same S on every rank
        if width > n_texts:
            text = F.pad(text, (0, 0, 0, width - n_texts))
            valid = F.pad(valid, (0, width - n_texts), value=False)
        z = self.embed_pages(h_p)
        cand = gather_with_grad(self.embed_text(text.to(z.dtype)))  # [B_world, S, P]
        cand_valid = gather_with_grad(valid.to(z.dtype)).bool().reshape(-1)
        cand_page = torch.arange(cand.shape[0], device=z.device).repeat_interleave(width)
        cand = cand.reshape(-1, cand.shape[-1])
        positives = (anchor_page + rank_offset(n_pages)).unsqueeze(1) == cand_page.unsqueeze(0)
        if self.queue_size:
            cand = torch.cat([cand, self.embed_text(self.queue.to(z.dtype))])
            cand_valid = torch.cat([cand_valid, self.queue_valid])
            positives = F.pad(positives, (0, self.queue_size), value=False)
        scores = self.logit_scale(z @ cand.T)
        loss = self.loss(scores, positives, cand_valid.unsqueeze(0).expand_as(scores))
        if self.symmetric:  # and each of this rank's texts finds its page among all ranks' page views
            loss = 0.5 * (loss + self._text_to_page(z, anchor_page, n_pages, width, cand, cand_valid))
        if self.queue_size and self.training:
            self._enqueue(gather_with_grad(text.detach()), gather_with_grad(valid.float()).bool())
        return loss, z

    def _text_to_page(self, z, anchor_page, n_pages, width, cand, cand_valid) -> torch.Tensor:
        """The reverse direction (CLIP's symmetric loss): anchors = this rank's valid texts,
        candidates = every rank's page views, positives = the views of the text's own page. Retrieval
        runs this way (a page's texts are the query), so training both ways fits what is measured."""
        offset = rank_offset(n_pages)
        first = offset * width  # this rank's texts inside the gathered candidates
        texts = cand[first:first + n_pages * width]
        text_valid = cand_valid[first:first + n_pages * width]
        text_page = torch.arange(n_pages, device=z.device).repeat_interleave(width) + offset
        z_all = gather_with_grad(z)
        view_page = gather_with_grad((anchor_page + offset).to(z.dtype)[:, None])[:, 0].long()
        rev = self.logit_scale(texts[text_valid] @ z_all.T)
        loss = self.loss(rev, text_page[text_valid].unsqueeze(1) == view_page.unsqueeze(0))
        if not is_distributed():
            return loss
        # ranks hold different numbers of valid texts: weight this rank's mean by its share, so the
        # average over ranks (DDP's gradient average) is the mean over all texts, as on one process
        n_local = text_valid.sum().to(loss.dtype)
        n_all = n_local.detach().clone()
        dist.all_reduce(n_all)
        return loss * n_local * dist.get_world_size() / n_all

    @torch.no_grad()
    def _enqueue(self, text: torch.Tensor, valid: torch.Tensor) -> None:
        rows = text[valid][-self.queue_size:]
        idx = (self.queue_ptr + torch.arange(rows.shape[0], device=rows.device)) % self.queue_size
        # new tensors (not in-place): the old queue is still saved in this step's autograd graph
        self.queue = self.queue.index_copy(0, idx, rows.to(self.queue.dtype))
        self.queue_valid = self.queue_valid.index_fill(0, idx, True)
        self.queue_ptr = (self.queue_ptr + rows.shape[0]) % self.queue_size
