"""The local text term (``objective.local_sem``): span-centred local views aligned with the texts they show.

On real pages the whole-page view the semantic head reads is too small for text to be legible
(docs/learning.md, "Semantic retrieval from text crops"); a span-centred local view
(``views.local_mode: spans``) shows text near its native size. Each local view ``v`` of page ``p``
becomes an anchor of the semantic head (``align["sem"]``: the same projection the page views use);
its positives ``P(v)`` are the spans of ``p`` whose box centre lies in ``v``'s window (always the span
it was drawn around; ``batch["local_span_mask"]``, from :mod:`gsdistill.views.multicrop`), its
negatives every other span of every page of the (gathered) batch:

    L_local_sem = mean_v -log( sum_{i in P(v)} exp(s <z_v, t_i>) / sum_{j valid} exp(s <z_v, t_j>) )

with the head's own multi-positive loss (MPCL by default). The student's local features are the
ones DINO reads (one backbone pass); a view showing none of the page's first ``max_spans`` spans
has no positive and drops out.
"""
from __future__ import annotations

import torch


def local_positives(shown: torch.Tensor) -> torch.Tensor:
    """Page-major ``bool[B, n_local, S]`` -> view-major ``bool[n_local * B, S]`` (the rows of ``local_crops``)."""
    return shown.transpose(0, 1).reshape(-1, shown.shape[-1])


def local_sem_term(model, h_local: torch.Tensor, p_local: torch.Tensor | None, image_hw, batch: dict,
                   n_pages: int, n_local: int, text_width: int | None) -> torch.Tensor:
    """``L_local_sem`` (module doc) of ``model`` (a :class:`GSDistill`) for the student's local features
    ``h_local [n_local * B, C]`` (``p_local``: their patch tokens, read when the head pools a grid)."""
    if "local_span_mask" not in batch:
        raise KeyError("objective.local_sem needs batch['local_span_mask'] (which spans each local view shows): "
                       "the views pipeline records it with views.local_mode=spans")
    shown = batch["local_span_mask"].to(h_local.device)
    if shown.shape[:2] != (n_pages, n_local) or shown.shape[2] != batch["sem_emb"].shape[1]:
        raise ValueError(f"local_span_mask {tuple(shown.shape)} must be [B, n_local, S] = "
                         f"({n_pages}, {n_local}, {batch['sem_emb'].shape[1]})")
    anchor_page = torch.arange(n_pages, device=h_local.device).repeat(n_local)
    loss, _ = model.align["sem"](model.head_inputs(h_local, p_local, image_hw, "sem"), anchor_page,
                                 batch["sem_emb"], batch["sem_valid"], text_width=text_width,
                                 text_positives=local_positives(shown))
    return loss
