"""Exact inner-product search: torch matmul + top-k in chunks, or a faiss ``IndexFlatIP``.

Both paths are exact and deterministic: results are ordered by score descending, ties by the
lower document index (a stable re-sort after top-k), so the same inputs give the same ranking.
"""
from __future__ import annotations

import torch

# above this many documents the default switches to faiss (its flat index is BLAS-tiled and
# keeps memory at one query chunk); torch's chunked path is exact and as fast below it
FAISS_MIN_DOCS = 1_000_000


def _stable_order(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-sort each row by (score desc, id asc) so ties never depend on the top-k kernel."""
    by_id = torch.argsort(ids, dim=1, stable=True)
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    by_score = torch.argsort(scores, dim=1, descending=True, stable=True)
    return scores.gather(1, by_score), ids.gather(1, by_score)


def _search_torch(queries: torch.Tensor, docs: torch.Tensor, k: int, query_chunk: int,
                  doc_chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    out_s, out_i = [], []
    for qs in range(0, queries.shape[0], query_chunk):
        q = queries[qs:qs + query_chunk]
        best_s = torch.empty(q.shape[0], 0, dtype=q.dtype, device=q.device)
        best_i = torch.empty(q.shape[0], 0, dtype=torch.long, device=q.device)
        for ds in range(0, docs.shape[0], doc_chunk):
            s = q @ docs[ds:ds + doc_chunk].T
            top_s, top_i = s.topk(min(k, s.shape[1]), dim=1)
            # merge the running best with this chunk's best
            cand_s, cand_i = torch.cat([best_s, top_s], 1), torch.cat([best_i, top_i + ds], 1)
            cand_s, cand_i = _stable_order(cand_s, cand_i)
            best_s, best_i = cand_s[:, :k], cand_i[:, :k]
        out_s.append(best_s)
        out_i.append(best_i)
    return torch.cat(out_s), torch.cat(out_i)


def _search_faiss(queries: torch.Tensor, docs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    import faiss
    import numpy as np

    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(np.ascontiguousarray(docs.detach().float().cpu().numpy()))
    s, i = index.search(np.ascontiguousarray(queries.detach().float().cpu().numpy()), k)
    s, i = torch.from_numpy(s), torch.from_numpy(i).long()
    s, i = _stable_order(s, i)
    return s.to(queries.device), i.to(queries.device)


def search(queries: torch.Tensor, docs: torch.Tensor, k: int, use_faiss: bool | None = None,
           query_chunk: int = 1024, doc_chunk: int = 262_144) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` documents by inner product for each query.

    Args:
        queries: ``float[Q, D]``; docs: ``float[N, D]`` (same device for the torch path).
        k: results per query; clipped to ``N``.
        use_faiss: True -> faiss ``IndexFlatIP``; False -> torch; None -> faiss when
            ``N >= FAISS_MIN_DOCS``.
    Returns:
        ``(scores float[Q, k], ids long[Q, k])``, best first.
    """
    if queries.dim() != 2 or docs.dim() != 2 or queries.shape[1] != docs.shape[1]:
        raise ValueError(f"search: queries {tuple(queries.shape)} and docs {tuple(docs.shape)} "
                         "must be [Q, D] and [N, D] with the same D")
    if k < 1:
        raise ValueError(f"search: k must be >= 1, got {k}")
    k = min(k, docs.shape[0])
    if k == 0 or queries.shape[0] == 0:
        return (torch.zeros(queries.shape[0], k, dtype=queries.dtype, device=queries.device),
                torch.zeros(queries.shape[0], k, dtype=torch.long, device=queries.device))
    if use_faiss is None:
        use_faiss = docs.shape[0] >= FAISS_MIN_DOCS
    if use_faiss:
        return _search_faiss(queries, docs, k)
    return _search_torch(queries, docs.to(queries.dtype), k, query_chunk, doc_chunk)
