"""Hard-negative mining per training query: BM25 (``bm25s``, pure Python) and dense (inner product of
the model's embeddings), as papers 000 / 001, DPR and Tevatron train.

A mined list is a query's top-``depth`` hits with every judged-relevant passage (grade > 0 in the
training labels) removed, then the first ``skip_top`` remaining hits skipped (false-negative guard:
the passages just below the positives are the likeliest unjudged relevant ones), then ``per_query``
kept. ``bm25+dense`` interleaves the two rankings (BM25 first) before filtering. Lists are cached
as JSON in a folder beside the runs, under a key hashed from everything that produced them (method,
depth, guard, corpus, queries, labels and the encoder's identity), so runs that share these reuse
one mining pass; re-mining with the weights being trained (``remine_every_epoch``) is not cached.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from gsdistill.retriever.data import RetrievalData

METHODS = ("none", "bm25", "dense", "bm25+dense")


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"negatives.method must be one of {', '.join(METHODS)}, got {method!r}")
    return method


def bm25_rankings(doc_texts: list[str], query_texts: list[str], depth: int) -> list[list[int]]:
    """Top-``depth`` corpus indices per query by BM25 (``bm25s`` defaults: k1 = 1.5, b = 0.75,
    English stop words, no stemming); documents with score 0 (no shared term) are left out."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(doc_texts, stopwords="en", show_progress=False), show_progress=False)
    q_tokens = bm25s.tokenize(query_texts, stopwords="en", return_ids=False, show_progress=False)
    k = min(depth, len(doc_texts))
    out = []
    for tokens in q_tokens:  # one at a time: a query with no known term must not fail the batch
        known = [t for t in tokens if t in retriever.vocab_dict]
        if not known:
            out.append([])
            continue
        ids, scores = retriever.retrieve([known], k=k, show_progress=False, n_threads=1)
        out.append([int(i) for i, s in zip(ids[0], scores[0]) if s > 0])
    return out


def dense_rankings(q_emb: torch.Tensor, doc_emb: torch.Tensor, depth: int) -> list[list[int]]:
    """Top-``depth`` corpus indices per query by inner product, ``q_emb [Q, D]``, ``doc_emb [N, D]``."""
    if q_emb.shape[0] == 0:
        return []
    scores = q_emb.float() @ doc_emb.float().T
    return scores.topk(min(depth, doc_emb.shape[0]), dim=1).indices.tolist()


def interleave(*rankings: list[int]) -> list[int]:
    """Round-robin merge without repeats: ``[a0, b0, a1, b1, ...]``."""
    out, seen = [], set()
    for rank in range(max((len(r) for r in rankings), default=0)):
        for r in rankings:
            if rank < len(r) and r[rank] not in seen:
                seen.add(r[rank])
                out.append(r[rank])
    return out


def select_negatives(ranked: list[int], relevant: set[int], skip_top: int, per_query: int) -> list[int]:
    """Hits that are not judged relevant, after skipping the first ``skip_top`` of them."""
    non_relevant = [i for i in ranked if i not in relevant]
    return non_relevant[skip_top:skip_top + per_query]


def relevant_indices(data: RetrievalData, qrels: dict[str, dict[str, float]], qid: str) -> set[int]:
    """Corpus indices of every passage judged relevant (grade > 0) to ``qid``."""
    return {data.doc_index[d] for d, g in qrels.get(qid, {}).items() if g > 0 and d in data.doc_index}


def mine_negatives(data: RetrievalData, qids: list[str], qrels: dict[str, dict[str, float]], method: str,
                   depth: int = 100, skip_top: int = 0, per_query: int = 30,
                   q_emb: torch.Tensor | None = None, doc_emb: torch.Tensor | None = None
                   ) -> dict[str, list[int]]:
    """``{qid: [corpus index]}`` mined negatives; dense methods need ``q_emb`` (rows in ``qids``
    order) and ``doc_emb`` (rows in corpus order)."""
    check_method(method)
    if depth < 1 or per_query < 1 or skip_top < 0:
        raise ValueError(f"negatives: need depth >= 1, per_query >= 1, skip_top >= 0, got {depth}, {per_query}, "
                         f"{skip_top}")
    if method == "none" or not qids:
        return {}
    search = depth + skip_top + max((len(relevant_indices(data, qrels, q)) for q in qids), default=0)
    lists = []
    if "bm25" in method:
        lists.append(bm25_rankings(data.doc_texts, [data.queries[q] for q in qids], search))
    if "dense" in method:
        if q_emb is None or doc_emb is None:
            raise ValueError("dense mining needs query and passage embeddings")
        if q_emb.shape[0] != len(qids) or doc_emb.shape[0] != len(data.doc_ids):
            raise ValueError(f"dense mining: {q_emb.shape[0]} query rows for {len(qids)} queries, "
                             f"{doc_emb.shape[0]} passage rows for {len(data.doc_ids)} docs")
        lists.append(dense_rankings(q_emb, doc_emb, search))
    return {q: select_negatives(interleave(*(r[row] for r in lists)), relevant_indices(data, qrels, q),
                                skip_top, per_query)
            for row, q in enumerate(qids)}


def mining_key(data: RetrievalData, qids: list[str], qrels: dict, settings: dict, encoder: str | None) -> dict:
    """What produced a mined list: mining settings, encoder identity and digests of the inputs."""
    def digest(obj) -> str:
        return hashlib.sha1(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()[:16]

    return {"settings": settings, "encoder": encoder if "dense" in settings["method"] else None,
            "corpus": digest([data.doc_ids, len(data.doc_texts), data.source]),
            "queries": digest({q: data.queries[q] for q in qids}),
            "labels": digest({q: qrels.get(q, {}) for q in qids})}


def cached_negatives(cache_dir: str | Path, key: dict, compute) -> tuple[dict[str, list[int]], Path, bool]:
    """``(negatives, file, reused)``: read ``cache_dir/<hash of key>.json`` when it holds the same key,
    else call ``compute()`` and write it there (key stored beside the lists). The file appears whole
    or not at all (written beside it, then renamed): runs sharing the folder never read half a file."""
    cache_dir = Path(cache_dir)
    name = hashlib.sha1(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:20]
    path = cache_dir / f"{name}.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("key") == key:
            return {q: [int(i) for i in v] for q, v in stored["negatives"].items()}, path, True
    negatives = compute()
    cache_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"key": key, "negatives": negatives}))
    return negatives, path, False


def write_atomic(path: Path, text: str) -> None:
    """``path.write_text(text)`` as one rename: a temporary file in the same folder, then
    ``os.replace`` (atomic on POSIX and Windows), removed if anything fails on the way."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
