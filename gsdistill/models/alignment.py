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
from gsdistill.losses.gather import equal_sizes, is_distributed
from gsdistill.losses.precision import fp32, no_autocast
from gsdistill.models.heads import ProjectionHead, TextProjection


def _global_max(n: int, device: torch.device) -> int:
    """Largest ``n`` over ranks: one collective and one host read (used only when the caller gives
    no host-known text width)."""
    if not is_distributed():
        return n
    t = torch.tensor([n], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _share_weighted(loss: torch.Tensor, n_local: torch.Tensor) -> torch.Tensor:
    """Under DDP, ``loss`` (a mean over this rank's ``n_local`` used anchors) weighted by this rank's
    share of all ranks' anchors, so the average over ranks is the mean over every anchor, as on one
    process. Tensors only: a collective but no host sync. Unchanged on one process."""
    if not is_distributed():
        return loss
    n_local = n_local.to(loss.dtype)
    n_all = n_local.detach().clone()
    dist.all_reduce(n_all)
    return loss * n_local * dist.get_world_size() / n_all.clamp(min=1)


class PageTextAlignment(nn.Module):
    """One contrastive head: ``forward(h_p [A,C], anchor_page long[A], text [B,S,Dt], valid bool[B,S])``
    -> ``(loss scalar, z_p [A, proj_dim] L2-normalised)``; ``anchor_page`` indexes this rank's B pages.

    ``anchor_valid: bool[A]`` (optional) leaves views out as anchors and, in the symmetric term, as
    candidates (``objective.align_views: visible``: the views iBOT masked). ``text_positives:
    bool[A, S]`` (optional) narrows each anchor's positives to those text slots of its own page
    (``objective.local_sem``: a local view and the spans it shows; candidate index = page * S + slot);
    an anchor left with none drops out. Such a call uses no memory bank: the page-level call of the
    same step has queued this batch's texts, which would come back as false negatives. Under several processes
    every rank must hold the same B pages (fixed per-rank batches); ``text_width`` (a host-known
    bound on S, e.g. ``views.max_spans``) spares the collective that agrees on S otherwise.
    Scores and losses run in float32 with autocast off (see ``gsdistill.losses.precision``).
    """

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
        """The head may run in bf16 (autocast, bf16 weights); its unit vector is float32."""
        return F.normalize(fp32(self.head(h_p)), dim=-1)

    def embed_text(self, text_emb: torch.Tensor) -> torch.Tensor:
        return F.normalize(fp32(self.text_proj(text_emb.to(self.text_proj.proj.weight.dtype))), dim=-1)

    def forward(self, h_p: torch.Tensor, anchor_page: torch.Tensor, text: torch.Tensor,
                valid: torch.Tensor, anchor_valid: torch.Tensor | None = None,
                text_width: int | None = None,
                text_positives: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if text.dim() != 3 or valid.shape != text.shape[:2]:
            raise ValueError(f"text {tuple(text.shape)} must be [B, S, D] with valid [B, S], got {tuple(valid.shape)}")
        if text_positives is not None and text_positives.shape != (h_p.shape[0], text.shape[1]):
            raise ValueError(f"text_positives {tuple(text_positives.shape)} must be [A, S] = "
                             f"({h_p.shape[0]}, {text.shape[1]})")
        if text.shape[-1] != self.text_proj.proj.in_features:
            raise ValueError(f"cached text embeddings have {text.shape[-1]} dims but model.text_dim is "
                             f"{self.text_proj.proj.in_features}: set model.text_dim (and model.text_encoder) "
                             "to the encoder the cache was built with")
        n_pages, n_texts = text.shape[:2]
        width = n_texts
        if is_distributed():  # all_gather needs the same S on every rank
            width = _global_max(n_texts, text.device) if text_width is None else int(text_width)
            if n_texts > width:
                raise ValueError(f"a page has {n_texts} texts, more than the text width {width} "
                                 "(views.max_spans) every rank pads to")
        if width > n_texts:
            text = F.pad(text, (0, 0, 0, width - n_texts))
            valid = F.pad(valid, (0, width - n_texts), value=False)
            if text_positives is not None:
                text_positives = F.pad(text_positives, (0, width - n_texts), value=False)
        sizes = equal_sizes(n_pages)  # pages per rank: the same on every rank (checked once)
        z = self.embed_pages(h_p)
        cand = gather_with_grad(self.embed_text(text), sizes)  # [B_world, S, P]
        cand_valid = gather_with_grad(valid.to(z.dtype), sizes).bool().reshape(-1)
        cand_page = torch.arange(cand.shape[0], device=z.device).repeat_interleave(width)
        cand = cand.reshape(-1, cand.shape[-1])
        offset = rank_offset(n_pages, sizes)
        positives = (anchor_page + offset).unsqueeze(1) == cand_page.unsqueeze(0)
        if anchor_valid is not None:  # such an anchor has no positive: the loss leaves it out
            positives = positives & anchor_valid.unsqueeze(1)
        if text_positives is not None:  # the same slot mask on every gathered page; only its own page matches
            positives = positives & text_positives.repeat(1, positives.shape[1] // width)
        queue = self.queue_size and text_positives is None
        if queue:
            cand = torch.cat([cand, self.embed_text(self.queue)])
            cand_valid = torch.cat([cand_valid, self.queue_valid])
            positives = F.pad(positives, (0, self.queue_size), value=False)
        with no_autocast(z):
            scores = self.logit_scale(z @ cand.T)
            loss = self.loss(scores, positives, cand_valid.unsqueeze(0).expand_as(scores))
            if anchor_valid is not None or text_positives is not None:
                loss = _share_weighted(loss, (positives & cand_valid).any(1).sum())
            if self.symmetric:  # and each of this rank's texts finds its page among all ranks' page views
                loss = 0.5 * (loss + self._text_to_page(z, anchor_page, anchor_valid, n_pages, width, offset,
                                                        cand, cand_valid, text_positives))
        if queue and self.training:
            self._enqueue(gather_with_grad(text.detach(), sizes), gather_with_grad(valid.float(), sizes).bool())
        return loss, z

    def _text_to_page(self, z, anchor_page, anchor_valid, n_pages, width, offset, cand, cand_valid,
                      text_positives=None) -> torch.Tensor:
        """The reverse direction (CLIP's symmetric loss): anchors = this rank's valid texts,
        candidates = every rank's page views, positives = the views of the text's own page (with
        ``text_positives``: those of them that show the text). Retrieval
        runs this way (a page's texts are the query), so training both ways fits what is measured.
        Padding texts stay in the matrix with no positive (the loss leaves them out): a boolean
        selection would be a host sync."""
        first = offset * width  # this rank's texts inside the gathered candidates
        texts = cand[first:first + n_pages * width]
        text_valid = cand_valid[first:first + n_pages * width]
        text_page = torch.arange(n_pages, device=z.device).repeat_interleave(width) + offset
        sizes = equal_sizes(z.shape[0])
        z_all = gather_with_grad(z, sizes)
        view_page = gather_with_grad((anchor_page + offset).to(z.dtype)[:, None], sizes)[:, 0].long()
        rev = self.logit_scale(texts @ z_all.T)
        positives = (text_page.unsqueeze(1) == view_page.unsqueeze(0)) & text_valid.unsqueeze(1)
        if text_positives is not None:  # [A_world, width] -> text row t = page * width + slot reads slot t % width
            shown = gather_with_grad(text_positives.to(z.dtype), sizes).bool()
            positives = positives & shown.T.repeat(n_pages, 1)
        view_valid = None
        if anchor_valid is not None:  # a hidden view is no candidate: its boxes cannot be seen
            view_valid = gather_with_grad(anchor_valid.to(z.dtype)[:, None], sizes)[:, 0].bool()
            positives = positives & view_valid.unsqueeze(0)
            view_valid = view_valid.unsqueeze(0).expand_as(rev)
        loss = self.loss(rev, positives, view_valid)
        # ranks hold different numbers of valid texts: weight this rank's mean by its share, so the
        # average over ranks (DDP's gradient average) is the mean over all texts, as on one process
        return _share_weighted(loss, positives.any(1).sum())

    @torch.no_grad()
    def _enqueue(self, text: torch.Tensor, valid: torch.Tensor) -> None:
        """The last ``queue_size`` valid texts into the ring buffer, with no host sync: a stable sort
        puts the valid rows last, and padding rows write back what their slot already holds."""
        flat, ok = text.flatten(0, 1), valid.flatten()
        order = torch.argsort(ok.to(torch.int8), stable=True)[-self.queue_size:]
        rows, row_ok = flat[order], ok[order]
        n_new = row_ok.sum()
        first = self.queue_ptr - (rows.shape[0] - n_new)  # where the first (maybe padding) row would go
        pos = (first + torch.arange(rows.shape[0], device=rows.device)) % self.queue_size
        # new tensors (not in-place): the old queue is still saved in this step's autograd graph
        self.queue = self.queue.index_copy(0, pos, torch.where(row_ok[:, None], rows.to(self.queue.dtype),
                                                               self.queue[pos]))
        self.queue_valid = self.queue_valid.index_copy(0, pos, row_ok | self.queue_valid[pos])
        self.queue_ptr = (self.queue_ptr + n_new) % self.queue_size
