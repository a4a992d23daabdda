"""Semantic retrieval over span-centred crops: a page is the set of its text crops at native size.

The page-view gallery of :mod:`gsdistill.eval.head_retrieval` (head ``sem``) embeds the whole page
at ``image_size`` px, where the text of a real page is 1-3 px high (docs/learning.md, "Semantic
retrieval from text crops"). Here a page's gallery entry is the set of crops pretraining's
span-centred local views show (``views.local_mode: spans``): for up to ``max_crops`` of its spans
(evenly spaced in reading order when it has more), the square of ``span_px`` page pixels centred on
the span's box centre and moved onto the page (:func:`gsdistill.views.multicrop.square_window`, with
no random scale or point), resized to ``crop_size`` px with OpenCV's area interpolation as the
views pipeline resizes, each embedded by backbone + semantic head (``embed_pages``, ImageNet
normalisation as for page views). A page without spans gets one crop at its centre.

The query is the page-view row's: ``k`` of the page's cached span texts (``sem_emb``, the same
seeded draw, :func:`gsdistill.eval.head_retrieval._queries`) through ``embed_text_sem``. With
``e_t`` a query text's and ``z_c`` a crop's unit embedding:

    s(t, p) = max_{c in crops(p)} <e_t, z_c>
    S(q, p) = mean_{t in q} s(t, p)                     (aggregation "mean")
            = T log sum_{t in q} exp(s(t, p) / T)        (aggregation "lse", T = ``temperature``)

Acc@1 / R@5 / MRR over the pages as in head retrieval (a tie is never a hit), with the 95 %
bootstrap over documents.
"""
from __future__ import annotations

from typing import Iterable

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from gsdistill.eval.head_retrieval import _queries, own_page_scores
from gsdistill.eval.page_retrieval import aggregate_crop_scores, embed_gallery, embedding_spread
from gsdistill.views.multicrop import has_area, square_window

MAX_SIMS = 1 << 24  # floats of one [Q, K, pages, crops] similarity chunk (64 MB)


def span_crop_windows(page: dict, span_px: float, max_crops: int = 32) -> list[tuple[int, int, int, int]]:
    """Windows ``[x0, y0, x1, y1)`` of the page's crops (module doc), in reading order."""
    spans = [s["bbox"] for s in page.get("spans", []) if has_area(s["bbox"])]
    if not spans:
        return [square_window(page, int(page["width"]) / 2, int(page["height"]) / 2, span_px)]
    pick = np.unique(np.linspace(0, len(spans) - 1, min(len(spans), max_crops)).round().astype(int))
    return [square_window(page, (spans[i][0] + spans[i][2]) / 2, (spans[i][1] + spans[i][3]) / 2, span_px)
            for i in pick]


def span_crops(page: dict, span_px: float, crop_size: int, max_crops: int = 32) -> list[torch.Tensor]:
    """The page's crops as ``uint8 [3, crop_size, crop_size]`` pixels."""
    image = np.asarray(page["image"].convert("RGB"))
    out = []
    for x0, y0, x1, y1 in span_crop_windows(page, span_px, max_crops):
        crop = cv2.resize(np.ascontiguousarray(image[y0:y1, x0:x1]), (crop_size, crop_size), interpolation=cv2.INTER_AREA)
        out.append(torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1))
    return out


def embed_span_crops(model, pages: list[dict], span_px: float, crop_size: int, max_crops: int = 32,
                     device: torch.device = torch.device("cpu"), batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit crop embeddings ``[N, C, D]`` and validity ``bool[N, C]`` (C = most crops of a page).
    Pages are cut and embedded a batch at a time, so only their embeddings are held."""
    rows, start = [], 0
    while start < len(pages):
        crops, counts = [], []
        while start < len(pages) and (not crops or len(crops) < batch_size):
            c = span_crops(pages[start], span_px, crop_size, max_crops)
            crops += c
            counts.append(len(c))
            start += 1
        rows += list(embed_gallery(model, crops, device, batch_size, progress=False).split(counts))
    width = max(len(r) for r in rows)
    emb = torch.zeros(len(rows), width, rows[0].shape[1])
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        emb[i, :len(r)], valid[i, :len(r)] = r, True
    return emb, valid


def best_crop_sims(queries: torch.Tensor, crops: torch.Tensor, crop_valid: torch.Tensor) -> torch.Tensor:
    """``s(t, p)``: ``queries [Q, K, D]``, ``crops [N, C, D]``, ``crop_valid bool[N, C]`` -> ``[Q, K, N]``,
    the best valid crop of each page per query text (chunks of pages keep memory at ``MAX_SIMS``)."""
    q, k, c = queries.shape[0], queries.shape[1], crops.shape[1]
    step = max(1, MAX_SIMS // max(q * k * c, 1))
    out = []
    for lo in range(0, crops.shape[0], step):
        sims = torch.einsum("qkd,ncd->qknc", queries, crops[lo:lo + step])
        out.append(sims.masked_fill(~crop_valid[lo:lo + step], float("-inf")).amax(-1))
    return torch.cat(out, dim=2)


@torch.no_grad()
def span_crop_retrieval(model, pages: Iterable[dict], k: int | None = 5, seed: int = 0, span_px: int | None = None,
                        crop_size: int | None = None, max_crops: int = 32, aggregation: str = "mean",
                        temperature: float = 0.05, batch_size: int = 64, device: str | torch.device = "cpu",
                        n_boot: int = 2000) -> dict:
    """Acc@1 / R@5 / MRR of finding each page from ``k`` of its span texts among the span-crop
    galleries of all pages (module doc). ``span_px`` / ``crop_size`` default to the model's
    pretraining local views (``model.span_crop_view``). Returns head retrieval's keys (``head`` =
    ``"sem"``) plus ``span_px``, ``crop_size``, ``max_crops`` and ``crops_per_page`` (mean)."""
    if span_px is None or crop_size is None:
        view = getattr(model, "span_crop_view", None)
        if view is None:
            raise ValueError("span_px and crop_size are needed: the model was not pretrained with span-centred "
                             "local views (views.local_mode=spans) to take them from")
        span_px, crop_size = span_px or view[0], crop_size or view[1]
    pages = list(pages)
    usable = [p for p in pages if "sem_emb" in p and len(p["sem_emb"])]
    if len(usable) < 2:
        raise ValueError(f"span-crop retrieval needs >= 2 pages with cached 'sem_emb' embeddings, got {len(usable)}")
    device = torch.device(device)
    model = model.to(device).eval()
    crops, crop_valid = embed_span_crops(model, usable, span_px, crop_size, max_crops, device, batch_size)
    text, valid = _queries(usable, "sem_emb", k, seed)
    q = F.normalize(model.embed_text_sem(text.reshape(-1, text.shape[-1]).to(device)).float(), dim=-1).cpu()
    sims = best_crop_sims(q.reshape(text.shape[0], text.shape[1], -1), crops, crop_valid)
    scores = aggregate_crop_scores(sims, valid, aggregation, temperature)
    return {"head": "sem", "k": k, "aggregation": aggregation, **own_page_scores(scores, usable, n_boot, seed),
            "skipped": len(pages) - len(usable), "spread": embedding_spread(crops[crop_valid]), "span_px": int(span_px),
            "crop_size": int(crop_size), "max_crops": int(max_crops),
            "crops_per_page": float(crop_valid.sum(1).float().mean())}
