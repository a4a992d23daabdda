"""Semantic label-noise injection (paper 004 §4): a share of the positives is replaced by a
similar but non-relevant document, the kind of mistake an annotator makes.

For each chosen (query, positive) pair the positive is swapped for the document nearest to it in
embedding space (inner product of the given doc embeddings) that is judged non-relevant (grade 0)
or unjudged for the query and not already a label of it; the swapped-in doc takes the positive's
grade and the true positive leaves the qrels. The whole corpus is searched in similarity order, so
every chosen positive is replaced unless the query judges every document relevant: the achieved
rate (``stats["achieved_rate"]``, replaced / positives) equals the requested one up to rounding.
Deterministic for a seed.
"""
from __future__ import annotations

import random

import torch

from gsdistill.retriever.data import RetrievalData


def inject_label_noise(data: RetrievalData, ratio: float, doc_emb: torch.Tensor | None = None,
                       seed: int = 0) -> tuple[dict[str, dict[str, float]], dict]:
    """Return ``(noisy_qrels, stats)``; ``data.qrels`` is left unchanged.

    Args:
        ratio: share of all (query, positive) pairs to corrupt, in [0, 1].
        doc_emb: ``float[N_docs, D]`` embeddings for "similar"; None -> a random non-relevant doc.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"label-noise ratio must be in [0, 1], got {ratio}")
    if doc_emb is not None and doc_emb.shape[0] != len(data.doc_ids):
        raise ValueError(f"doc embeddings have {doc_emb.shape[0]} rows, corpus has {len(data.doc_ids)} docs")
    rng = random.Random(seed)
    pairs = sorted((q, d) for q, g in data.qrels.items() for d, v in g.items() if v > 0)
    chosen = rng.sample(pairs, round(ratio * len(pairs)))
    noisy = {q: dict(g) for q, g in data.qrels.items()}
    by_query: dict[str, list[str]] = {}
    for q, d in chosen:
        by_query.setdefault(q, []).append(d)
    replaced = 0
    for q, docs in sorted(by_query.items()):
        relevant = {d for d, v in data.qrels[q].items() if v > 0}
        pos_idx = [data.doc_index[d] for d in docs]
        if doc_emb is not None:  # every doc, nearest first
            sims = doc_emb[pos_idx].float() @ doc_emb.float().T
            neighbours = sims.argsort(dim=1, descending=True).tolist()
        else:
            neighbours = [rng.sample(range(len(data.doc_ids)), len(data.doc_ids)) for _ in docs]
        for d, near in zip(docs, neighbours):
            swap = next((data.doc_ids[i] for i in near
                         if data.doc_ids[i] not in relevant and noisy[q].get(data.doc_ids[i], 0) <= 0), None)
            if swap is None:  # every neighbour is relevant or already a label; keep the clean label
                continue
            noisy[q][swap] = noisy[q].pop(d)
            replaced += 1
    stats = {"positives": len(pairs), "chosen": len(chosen), "replaced": replaced,
             "kept_no_candidate": len(chosen) - replaced, "requested_rate": ratio,
             "achieved_rate": replaced / len(pairs) if pairs else 0.0}
    return noisy, stats
