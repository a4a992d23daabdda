"""Crop-subsampled page retrieval (paper 003 §6.2, Table 2).

Every gallery page is also a query: k of its text spans ("crops") are sampled (seeded, kept in
reading order) and must retrieve the page image among the ``n_gallery`` pages. The query side is
the frozen text encoder followed by the model's semantic text projection (``embed_text_sem``), the
gallery side is the page-image embedding (``embed_pages``). Two scorings, as in Table 2:

- ``multi_positive``: each crop is embedded on its own; the page score aggregates the k
  crop-to-page cosines ``s_c``: ``lse`` = ``T * log sum_c exp(s_c / T)`` (default), ``mean`` or ``max``.
- ``single_positive``: the k crops are joined in reading order into one text, one embedding, cosine.

Metrics (``gsdistill.eval.metrics.evaluate``): Acc@1, R@5, R@10 and MRR (over the top
``run_depth`` pages), each a mean and a spread over the crop-sampling seeds. Search is exact by
default (chunked matmul); for large galleries a faiss index proposes ``candidates`` pages per crop,
which are rescored exactly (exact for ``max``; a close approximation for ``lse``/``mean``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from tqdm import tqdm

from gsdistill.device import resolve_device
from gsdistill.eval import index, metrics
from gsdistill.eval.page_gallery import page_crops, select_gallery  # noqa: F401  (public here too)

MEASURES = ("Acc@1", "R@5", "R@10", "MRR")
SCORINGS = ("multi_positive", "single_positive")
AGGREGATIONS = ("lse", "mean", "max")
_CHUNK_ELEMENTS = 1 << 24  # score-tensor elements per query chunk (64 MiB of float32)


def sample_crops(n_crops: list[int], k: int, seed: int) -> list[np.ndarray]:
    """Per page, ``min(k, n)`` distinct crop indices in reading order; seeded by (seed, k)."""
    if k < 1:
        raise ValueError(f"crops per query must be >= 1, got k={k}")
    rng = np.random.default_rng([seed, k])
    return [np.sort(rng.choice(n, size=min(k, n), replace=False)) for n in n_crops]


def aggregate_crop_scores(sims: torch.Tensor, valid: torch.Tensor, aggregation: str = "lse",
                          temperature: float = 0.05) -> torch.Tensor:
    """Page scores from crop scores: ``sims [Q, K, N]``, ``valid bool[Q, K]`` -> ``[Q, N]``.

    lse: ``T * logsumexp_c(s_c / T)`` over valid crops; mean: their mean; max: their maximum.
    Every query needs at least one valid crop.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation '{aggregation}'; choose one of {', '.join(AGGREGATIONS)}")
    if not bool(valid.any(1).all()):
        raise ValueError("every query needs at least one valid crop")
    mask = valid.unsqueeze(-1)
    if aggregation == "mean":
        return (sims * mask).sum(1) / mask.sum(1).to(sims.dtype)
    masked = sims.masked_fill(~mask, float("-inf"))
    if aggregation == "max":
        return masked.amax(1)
    if temperature <= 0:
        raise ValueError(f"lse temperature must be > 0, got {temperature}")
    return temperature * torch.logsumexp(masked / temperature, dim=1)


def _topk_rows(scores: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    # stable sort: equal scores keep gallery order, so the result is deterministic
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :depth]
    return scores.gather(1, order), order


def multi_positive_search(crop_emb: torch.Tensor, crop_index: torch.Tensor, gallery: torch.Tensor,
                          depth: int, aggregation: str = "lse", temperature: float = 0.05,
                          use_faiss: bool = False, candidates: int = 200
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top ``depth`` pages per query under aggregated per-crop scoring.

    ``crop_emb [C, D]``; ``crop_index long[Q, K]`` rows of crop_emb per query, -1 = padding;
    ``gallery [N, D]``. Returns (scores ``[Q, depth]``, gallery ids ``long[Q, depth]``); in faiss mode
    ids of -1 (score -inf) fill rows with fewer distinct candidates than ``depth``.
    """
    n_q, n_k = crop_index.shape
    n_gal = gallery.shape[0]
    depth = min(depth, n_gal)
    valid = crop_index >= 0
    safe = crop_index.clamp_min(0)
    if use_faiss:
        n_cand = min(candidates, n_gal)
        _, cand = index.search(crop_emb, gallery, k=n_cand, use_faiss=True)
        cand = torch.as_tensor(cand, dtype=torch.long)
    out_s, out_i = [], []
    width = n_k * (min(candidates, n_gal) if use_faiss else n_gal)
    step = max(1, _CHUNK_ELEMENTS // max(width, 1))
    for start in range(0, n_q, step):
        rows, ok = safe[start:start + step], valid[start:start + step]
        q_emb = crop_emb[rows]                                   # [q, K, D]
        if not use_faiss:
            sims = torch.einsum("qkd,nd->qkn", q_emb, gallery)
            scores, ids = _topk_rows(aggregate_crop_scores(sims, ok, aggregation, temperature), depth)
        else:
            ids_all = cand[rows].masked_fill(~ok.unsqueeze(-1), -1).flatten(1)  # [q, K*n_cand]
            ids_all, _ = torch.sort(ids_all, dim=1)
            dup = torch.zeros_like(ids_all, dtype=torch.bool)
            dup[:, 1:] = ids_all[:, 1:] == ids_all[:, :-1]
            drop = dup | (ids_all < 0)
            sims = torch.einsum("qkd,qmd->qkm", q_emb, gallery[ids_all.clamp_min(0)])
            agg = aggregate_crop_scores(sims, ok, aggregation, temperature).masked_fill(drop, float("-inf"))
            scores, pos = _topk_rows(agg, min(depth, agg.shape[1]))
            ids = ids_all.gather(1, pos).masked_fill(torch.isinf(scores), -1)
        out_s.append(scores)
        out_i.append(ids)
    return torch.cat(out_s), torch.cat(out_i)


def single_positive_search(query_emb: torch.Tensor, gallery: torch.Tensor, depth: int,
                           use_faiss: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Top ``depth`` pages per concatenated-crop query (plain inner-product search)."""
    scores, ids = index.search(query_emb, gallery, k=min(depth, gallery.shape[0]), use_faiss=use_faiss)
    return torch.as_tensor(scores), torch.as_tensor(ids, dtype=torch.long)


def to_run(scores: torch.Tensor, ids: torch.Tensor, page_ids: list[str]) -> dict[str, dict[str, float]]:
    """TREC-style run ``{query page id: {gallery page id: score}}`` (query i is gallery page i)."""
    run = {}
    for q, (row_s, row_i) in enumerate(zip(scores.tolist(), ids.tolist())):
        run[page_ids[q]] = {page_ids[i]: s for s, i in zip(row_s, row_i) if i >= 0}
    return run


@torch.no_grad()
def embed_gallery(model, images: list[torch.Tensor], device: torch.device, batch_size: int = 32,
                  progress: bool = True) -> torch.Tensor:
    """uint8 page images ``[3, S, S]`` -> L2-normalised ``embed_pages`` rows ``[N, D]`` (on CPU)."""
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD, device=device).view(1, 3, 1, 1)
    out = []
    for start in tqdm(range(0, len(images), batch_size), desc="embed pages", disable=not progress):
        x = torch.stack(images[start:start + batch_size]).to(device).float().div_(255.0)
        out.append(F.normalize(model.embed_pages((x - mean) / std).float(), dim=-1).cpu())
    return torch.cat(out)


class CachedTextEncoder:
    """Wraps a text encoder so each distinct text is encoded once, across models, calls and runs.

    The frozen encoder's output does not depend on the model being evaluated, so the SP and MPCL
    models of Table 2 share one of these and pay the (CPU-dominant) encoder cost once. With a
    ``path`` the cache is read from / written to ``path`` (safetensors) + ``path.json`` (texts and
    encoder name); a file written by another encoder is an error, never reused.
    """

    def __init__(self, encoder, path: str | Path | None = None):
        self.encoder = encoder
        self.name = str(getattr(encoder, "name", type(encoder).__name__))
        self.cache: dict[str, torch.Tensor] = {}
        self.path = Path(path) if path else None
        if self.path is not None and self.path.is_file():
            meta = json.loads(self.path.with_suffix(".json").read_text())
            if meta["encoder"] != self.name:
                raise ValueError(f"{self.path}: text cache of encoder '{meta['encoder']}', not '{self.name}'")
            self.cache = dict(zip(meta["texts"], load_file(str(self.path))["emb"]))

    def encode(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        new = list(dict.fromkeys(t for t in texts if t not in self.cache))
        if new:
            emb = torch.as_tensor(self.encoder.encode(new, batch_size=batch_size)).float().cpu()
            self.cache.update(zip(new, emb))
        if not texts:
            return torch.zeros(0, 0)
        return torch.stack([self.cache[t] for t in texts])

    def save(self) -> Path | None:
        """Write the cache to ``path`` (atomically: temp file, then rename); None without a path."""
        if self.path is None or not self.cache:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        texts = list(self.cache)
        tmp = self.path.with_name(self.path.name + ".tmp")
        save_file({"emb": torch.stack([self.cache[t] for t in texts]).contiguous()}, str(tmp))
        self.path.with_suffix(".json").write_text(json.dumps({"encoder": self.name, "texts": texts}))
        tmp.replace(self.path)
        return self.path


class TextEmbedder:
    """Texts -> L2-normalised ``embed_text_sem`` rows, each distinct text encoded once (cached)."""

    def __init__(self, model, text_encoder, device: torch.device, batch_size: int = 64,
                 progress: bool = True):
        self.model, self.encoder, self.device = model, text_encoder, device
        self.batch_size, self.progress = batch_size, progress
        self.rows: dict[str, int] = {}
        self.table = torch.zeros(0, 0)

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> torch.Tensor:
        new = list(dict.fromkeys(t for t in texts if t not in self.rows))
        if new:
            parts = []
            for start in tqdm(range(0, len(new), 4 * self.batch_size), desc="embed texts",
                              disable=not self.progress or len(new) <= 4 * self.batch_size):
                chunk = new[start:start + 4 * self.batch_size]
                emb = torch.as_tensor(self.encoder.encode(chunk, batch_size=self.batch_size))
                parts.append(F.normalize(self.model.embed_text_sem(emb.to(self.device)).float(), dim=-1).cpu())
            emb = torch.cat(parts)
            base = len(self.rows)
            self.table = emb if base == 0 else torch.cat([self.table, emb])
            self.rows.update({t: base + i for i, t in enumerate(new)})
        return self.table[[self.rows[t] for t in texts]]


def embedding_spread(emb: torch.Tensor) -> dict[str, float]:
    """Collapse diagnostics of L2-normalised rows ``[N, D]``: mean off-diagonal cosine and the
    effective rank ``exp(entropy of the normalised singular values)`` (1 = all rows identical)."""
    n = emb.shape[0]
    gram = emb @ emb.T
    mean_cos = float((gram.sum() - gram.diagonal().sum()) / max(n * (n - 1), 1))
    sv = torch.linalg.svdvals(emb.double())
    p = sv / sv.sum()
    return {"mean_pairwise_cos": mean_cos, "effective_rank": float(torch.exp(-(p * p.clamp_min(1e-30).log()).sum()))}


def evaluate_page_retrieval(model, pages: Iterable[dict], text_encoder=None, cfg=None,
                            progress: bool = True) -> dict:
    """Per-k, per-scoring retrieval metrics of ``model`` on held-out ``pages`` (see module doc).

    ``model``: has ``embed_pages(float[B,3,S,S]) -> [B,D]`` and ``embed_text_sem(float[M,Dt]) -> [M,D]``;
    ``text_encoder``: has ``encode(texts, batch_size) -> float[M, Dt]`` (default: a ``TextEncoder``
    named by ``model.text_encoder_name``); ``cfg``: the eval config as ``gsdistill.config.load_config
    ("eval", ...)`` resolves and checks it (None: its defaults).
    Returns ``{"summary": {scoring: {k: {measure: {"mean", "std"}}}}, "per_seed": {scoring: {k:
    {seed: {measure: value}}}}, "crops_per_query": {k: mean}, "n_gallery", "chance_acc1", counts...}``.
    """
    from omegaconf import DictConfig, OmegaConf
    if cfg is None:
        from gsdistill.config import load_config
        cfg = load_config("eval")
    if not isinstance(cfg, DictConfig) or "retrieval" not in cfg:
        raise TypeError("cfg must be the eval config from gsdistill.config.load_config('eval', ...), "
                        f"got {type(cfg).__name__}")
    c = OmegaConf.to_container(cfg.retrieval, resolve=True)
    for s in c["scorings"]:
        if s not in SCORINGS:
            raise ValueError(f"unknown scoring '{s}'; choose from {', '.join(SCORINGS)}")
    # the loader checked types, ranges and the one-word choices; list elements are checked here
    device = resolve_device(c["device"])
    if hasattr(model, "to"):
        model = model.to(device)
    if hasattr(model, "eval"):
        model.eval()
    if text_encoder is None:
        from gsdistill.models.text_encoder import TextEncoder
        text_encoder = TextEncoder(getattr(model, "text_encoder_name", None), device=device)
    size = int(c["image_size"] or 224)
    gallery, counts = select_gallery(pages, int(c["n_gallery"]), size, int(c["gallery_seed"]),
                                     int(c["min_span_chars"]), bool(c["dedupe_text"]))
    if len(gallery) < 2:
        raise ValueError(f"page retrieval needs at least 2 usable pages, found {len(gallery)} "
                         f"(counts: {counts})")
    n = len(gallery)
    page_ids = [g["id"] for g in gallery]
    use_faiss = bool(c["use_faiss"]) if c["use_faiss"] is not None else n >= int(c["faiss_min_gallery"])
    embed = TextEmbedder(model, text_encoder, device, int(c["text_batch_size"]), progress)
    images = [g.pop("image") for g in gallery]
    if c["gallery_side"] == "text":  # diagnostic: the page's whole text stands in for its image
        gal_emb = embed([c["sp_separator"].join(g["crops"]) for g in gallery])
    elif c["gallery_side"] == "image":
        gal_emb = embed_gallery(model, images, device, int(c["batch_size"]), progress)
    else:
        raise ValueError(f"gallery_side must be 'image' or 'text', got {c['gallery_side']!r}")
    # only crops some (k, seed) samples are encoded; the rest of crop_emb stays zero, never read
    picks_all = {(int(k), int(seed)): sample_crops([len(g["crops"]) for g in gallery], int(k), int(seed))
                 for k in c["ks"] for seed in c["seeds"]}
    offsets = np.cumsum([0] + [len(g["crops"]) for g in gallery])
    used = np.unique(np.concatenate([offsets[q] + p for picks in picks_all.values() for q, p in enumerate(picks)]))
    flat = [t for g in gallery for t in g["crops"]]
    sampled = embed([flat[i] for i in used])
    crop_emb = torch.zeros(len(flat), sampled.shape[1])
    crop_emb[torch.from_numpy(used)] = sampled
    qrels = {pid: {pid: 1} for pid in page_ids}
    depth = int(c["run_depth"])
    per_seed: dict = {s: {} for s in c["scorings"]}
    hits: dict = {s: {} for s in c["scorings"]}
    crops_used = {}
    for k in c["ks"]:
        for seed in c["seeds"]:
            picks = picks_all[int(k), int(seed)]
            crops_used[k] = float(np.mean([len(p) for p in picks]))
            for scoring in c["scorings"]:
                if scoring == "multi_positive":
                    idx = torch.full((n, max(len(p) for p in picks)), -1, dtype=torch.long)
                    for q, p in enumerate(picks):
                        idx[q, :len(p)] = torch.from_numpy(offsets[q] + p)
                    scores, ids = multi_positive_search(crop_emb, idx, gal_emb, depth, c["aggregation"],
                                                        float(c["temperature"]), use_faiss, int(c["candidates"]))
                else:
                    texts = [c["sp_separator"].join(g["crops"][j] for j in p) for g, p in zip(gallery, picks)]
                    scores, ids = single_positive_search(embed(texts), gal_emb, depth, use_faiss)
                run = to_run(scores, ids, page_ids)
                values = metrics.evaluate(run, qrels, MEASURES)
                per_seed[scoring].setdefault(k, {})[seed] = {m: float(values[m]) for m in MEASURES}
                # top-1 hit per query (gallery order) for paired comparisons between models/scorings
                hits[scoring].setdefault(k, {})[seed] = [int(int(i) >= 0 and page_ids[int(i)] == pid)
                                                         for pid, i in zip(page_ids, ids[:, 0])]
    summary = {s: {k: {m: {"mean": float(np.mean([v[m] for v in by_seed.values()])),
                           # sample std over seeds (ddof=1); a single seed has no spread
                           "std": float(np.std([v[m] for v in by_seed.values()], ddof=1)) if len(by_seed) > 1
                           else 0.0} for m in MEASURES}
                   for k, by_seed in per_k.items()} for s, per_k in per_seed.items()}
    return {"summary": summary, "per_seed": per_seed, "crops_per_query": crops_used, "n_gallery": n,
            "chance_acc1": 1.0 / n, "search": "faiss+rescore" if use_faiss else "exact",
            "aggregation": c["aggregation"], "temperature": float(c["temperature"]),
            "image_size": size, "n_docs": len({g["doc_id"] for g in gallery}),
            "gallery_spread": embedding_spread(gal_emb), "crop_spread": embedding_spread(sampled),
            "hits_at_1": hits, "page_ids": page_ids, "doc_ids": [g["doc_id"] for g in gallery], **counts}
