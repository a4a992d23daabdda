"""What the two alignment heads learned: page retrieval from a page's own cached texts, per head.

For every page of a set, its positives from the text cache (``gsdistill tuples embed``) are the
query and all page images of the set are the candidates, scored exactly as in training:

- ``geom``: all of the page's box-text descriptors (``geom_emb``) -> ``embed_text_geom``; the
  gallery is ``embed_pages_geom`` of the whole page (one scale-1 view at ``image_size``);
- ``sem``: ``k`` of its spans (``sem_emb``, seeded draw) -> ``embed_text_sem`` vs ``embed_pages``.

A page's score aggregates its texts' cosines: ``mean`` for the descriptors (a layout is the *set* of
its boxes; single descriptors such as "Page-footer, bottom, centre" occur on most pages: with the
max-like ``lse`` at T = 0.05 even an oracle gallery, each page's mean descriptor embedding, finds
only 3.5% of 256 synthetic pages, with ``mean`` 100%), and ``T * logsumexp(cos / T)`` (the eval
stage's ``lse``) for the spans, each of which is distinctive on its own.
Acc@1 comes with a 95% percentile bootstrap interval that resamples **documents**, not pages (pages
of one document are correlated), and the chance level ``1 / n_pages``. The gallery's effective
rank (``embedding_spread``) tells a collapsed page embedding from a learned one. Run it on the
training pages (what the objective fitted) and on held-out pages (what transfers).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from gsdistill.eval.page_gallery import _image_tensor
from gsdistill.eval.page_retrieval import aggregate_crop_scores, embed_gallery, embedding_spread

HEADS = {"geom": ("geom_emb", "embed_pages_geom", "embed_text_geom"),
         "sem": ("sem_emb", "embed_pages", "embed_text_sem")}
DEFAULT_AGGREGATION = {"geom": "mean", "sem": "lse"}


class _GeomView:
    """Adapter: ``embed_pages`` of the geometric head, so ``embed_gallery`` serves both heads."""

    def __init__(self, model, method: str):
        self.model, self.method = model, method

    def embed_pages(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model, self.method)(x)


def bootstrap_by_document(hits: np.ndarray, doc_ids: list[str], n_boot: int = 2000,
                          seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of ``hits`` when whole documents are resampled."""
    docs = sorted(set(doc_ids))
    index = {d: i for i, d in enumerate(docs)}
    per_doc_sum = np.zeros(len(docs))
    per_doc_n = np.zeros(len(docs))
    for h, d in zip(hits, doc_ids):
        per_doc_sum[index[d]] += h
        per_doc_n[index[d]] += 1
    rng = np.random.default_rng(seed)
    draw = rng.integers(0, len(docs), size=(n_boot, len(docs)))
    means = per_doc_sum[draw].sum(1) / per_doc_n[draw].sum(1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _queries(pages: list[dict], key: str, k: int | None, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded texts ``[Q, K, Dt]`` and validity ``[Q, K]``: all texts (``k`` None) or ``k`` drawn."""
    rng = np.random.default_rng([seed, k or 0])
    rows = []
    for p in pages:
        emb = np.asarray(p[key], dtype=np.float32).reshape(len(p[key]), -1)
        if k is not None and len(emb) > k:
            emb = emb[np.sort(rng.choice(len(emb), size=k, replace=False))]
        rows.append(torch.from_numpy(emb))
    width = max(len(r) for r in rows)
    dim = max(r.shape[1] for r in rows)
    out, valid = torch.zeros(len(rows), width, dim), torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        out[i, :len(r)], valid[i, :len(r)] = r, True
    return out, valid


@torch.no_grad()
def head_retrieval(model, pages: Iterable[dict], head: str = "geom", image_size: int = 96,
                   k: int | None = None, seed: int = 0, temperature: float = 0.05, batch_size: int = 32,
                   device: str | torch.device = "cpu", n_boot: int = 2000, aggregation: str | None = None) -> dict:
    """Acc@1 / R@5 / MRR of retrieving each page from its own texts through one head (module doc).

    ``pages``: page tuples with ``image``, ``id``, ``doc_id`` and cached embeddings; pages with no
    text for the head are skipped and counted. Returns ``{acc1, ci95, r5, mrr, chance, n_pages,
    n_docs, skipped, spread, hits}``.
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {sorted(HEADS)}, got {head!r}")
    key, page_method, text_method = HEADS[head]
    pages = list(pages)
    usable = [p for p in pages if key in p and len(p[key])]
    if len(usable) < 2:
        raise ValueError(f"head retrieval needs >= 2 pages with cached '{key}' embeddings, got {len(usable)}")
    device = torch.device(device)
    model = model.to(device).eval()
    images = [_image_tensor(p["image"], image_size) for p in usable]
    gallery = embed_gallery(_GeomView(model, page_method), images, device, batch_size, progress=False)
    text, valid = _queries(usable, key, k, seed)
    proj = getattr(model, text_method)
    q = F.normalize(proj(text.reshape(-1, text.shape[-1]).to(device)).float(), dim=-1).cpu()
    sims = (q @ gallery.T).reshape(text.shape[0], text.shape[1], -1)
    aggregation = aggregation or DEFAULT_AGGREGATION[head]
    scores = aggregate_crop_scores(sims, valid, aggregation, temperature)
    return {"head": head, "k": k, "aggregation": aggregation, **own_page_scores(scores, usable, n_boot, seed),
            "skipped": len(pages) - len(usable), "spread": embedding_spread(gallery)}


def own_page_scores(scores: torch.Tensor, pages: list[dict], n_boot: int, seed: int) -> dict:
    """``scores [Q, N]`` of query ``i`` (page ``i``'s texts) against every page -> ``{acc1, ci95, r5, mrr,
    chance, n_pages, n_docs, hits, page_ids}``, the interval a bootstrap over ``pages``' documents."""
    true = scores.diagonal().unsqueeze(1)
    # a tie is never a hit and costs half a place in the rank: a collapsed model (all pages equal)
    # must score as chance, not as perfect
    better, ties = (scores > true).sum(1), (scores == true).sum(1) - 1
    rank = better.float() + 1 + ties.float() / 2
    hits = ((better == 0) & (ties == 0)).numpy().astype(float)
    doc_ids = [str(p.get("doc_id") or p["id"]) for p in pages]
    lo, hi = bootstrap_by_document(hits, doc_ids, n_boot, seed)
    return {"acc1": float(hits.mean()), "ci95": [lo, hi], "r5": float((rank <= 5).float().mean()),
            "mrr": float((1.0 / rank).mean()), "chance": 1.0 / len(pages), "n_pages": len(pages),
            "n_docs": len(set(doc_ids)), "hits": hits.tolist(), "page_ids": [p["id"] for p in pages]}
