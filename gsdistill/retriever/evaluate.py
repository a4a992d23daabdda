"""Evaluate a dual encoder: encode the corpus, exact inner-product search, IR metrics, TREC run file.

Metrics come from ``gsdistill.eval.metrics`` (equal to pytrec_eval / ir_measures, tested);
search from ``gsdistill.eval.index`` (exact; faiss ``IndexFlatIP`` for large corpora).
``min_relevance`` is trec_eval's ``-l``: binary measures (MRR, recall, precision, accuracy) count a
doc as relevant when its grade is >= it (TREC DL uses 2); nDCG keeps the graded gains.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import torch

from gsdistill.eval import metrics
from gsdistill.eval.index import search
from gsdistill.retriever.data import RetrievalData, UniqueIds, open_text
from gsdistill.retriever.model import DualEncoder


def encode_corpus(model: DualEncoder, data: RetrievalData, batch_size: int = 64, progress: bool = True
                  ) -> torch.Tensor:
    """Passage embeddings ``float[N_docs, D]`` (CPU), in corpus order."""
    return model.encode(data.doc_texts, "passage", batch_size, progress=progress)


def retrieve(model: DualEncoder, data: RetrievalData, qids: list[str], doc_emb: torch.Tensor, k: int = 1000,
             batch_size: int = 64, use_faiss: bool | None = None) -> dict[str, dict[str, float]]:
    """TREC-style run ``{qid: {docid: score}}`` of the top-``k`` docs per query (raw inner products)."""
    if not qids:
        return {}
    q_emb = model.encode([data.queries[q] for q in qids], "query", batch_size)
    return run_from_embeddings(data, qids, q_emb, doc_emb, k, use_faiss)


def run_from_embeddings(data: RetrievalData, qids: list[str], q_emb: torch.Tensor, doc_emb: torch.Tensor,
                        k: int = 1000, use_faiss: bool | None = None) -> dict[str, dict[str, float]]:
    """The run of query embeddings ``[len(qids), D]`` against the corpus embeddings (any encoder)."""
    scores, ids = search(q_emb, doc_emb.to(q_emb.dtype), k, use_faiss=use_faiss)
    return {q: {data.doc_ids[i]: float(s) for s, i in zip(row_s.tolist(), row_i.tolist())}
            for q, row_s, row_i in zip(qids, scores, ids)}


def write_trec_run(run: dict[str, dict[str, float]], path: str | Path, tag: str = "gsdistill") -> Path:
    """``qid Q0 docid rank score tag`` lines, ranked as trec_eval ranks them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for qid in sorted(run):
            for rank, docid in enumerate(metrics.rank_documents(run[qid]), 1):
                f.write(f"{qid} Q0 {docid} {rank} {run[qid][docid]:.6f} {tag}\n")
    return path


def read_trec_run(path: str | Path, skipped: Counter | None = None) -> dict[str, dict[str, float]]:
    """``{qid: {docid: score}}``; a (query, document) pair listed again with another score is an
    error naming both lines, an exact repeat is kept once (counted in ``skipped`` when given)."""
    run: dict[str, dict[str, float]] = {}
    pairs = UniqueIds(path, "run entry (query, document)")
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 6:
                raise ValueError(f"{path}:{n}: a TREC run line has 6 fields, got {len(parts)}")
            try:
                score = float(parts[4])
            except ValueError:
                raise ValueError(f"{path}:{n}: score '{parts[4]}' is not a number") from None
            if pairs.add((parts[0], parts[2]), score, n):
                run.setdefault(parts[0], {})[parts[2]] = score
    pairs.count_repeats(skipped if skipped is not None else Counter(), Path(path).name)
    return run


def thresholded_qrels(qrels: dict, min_relevance: float) -> dict[str, dict[str, int]]:
    """Binary qrels for the binary measures: 1 where ``grade >= min_relevance``, else 0."""
    return {q: {d: int(g >= min_relevance) for d, g in docs.items()} for q, docs in qrels.items()}


def score_run(run: dict, qrels: dict, measures: list[str], min_relevance: float = 1.0):
    """``(means, counts, per_query)``: nDCG on the grades, the other measures on the grades
    thresholded at ``min_relevance``."""
    graded = [m for m in measures if m.lower().startswith("ndcg")]
    binary = [m for m in measures if m not in graded]
    means, counts, per_query = {}, {}, {}
    for names, labels in ((graded, qrels), (binary, thresholded_qrels(qrels, min_relevance))):
        if not names:
            continue
        m, c = metrics.evaluate_with_counts(run, labels, names)
        means.update(m)
        counts = c if not counts else {key: max(counts[key], c[key]) for key in c}
        for q, vals in metrics.evaluate_per_query(run, labels, names).items():
            per_query.setdefault(q, {}).update(vals)
    return {name: means[name] for name in measures}, counts, per_query


def evaluate_retriever(model: DualEncoder, data: RetrievalData, qids: list[str] | None = None, k: int = 1000,
                       measures=metrics.DEFAULT_MEASURES, doc_emb: torch.Tensor | None = None,
                       batch_size: int = 64, use_faiss: bool | None = None, out_dir: str | Path | None = None,
                       tag: str = "gsdistill", progress: bool = True, min_relevance: float = 1.0) -> dict:
    """Metrics over ``qids`` (default: every judged query); writes run.trec + metrics.json to out_dir.

    Returns ``{"metrics": {...}, "counts": {...}, "seconds": {...}}``.
    """
    data.require_usable()
    qids = data.judged_queries() if qids is None else list(qids)
    if not qids:
        raise ValueError(f"{data.source}: no query with a relevant document to evaluate")
    t0 = time.perf_counter()
    if doc_emb is None:
        doc_emb = encode_corpus(model, data, batch_size, progress)
    t1 = time.perf_counter()
    run = retrieve(model, data, qids, doc_emb, k, batch_size, use_faiss)
    t2 = time.perf_counter()
    qrels = {q: data.qrels[q] for q in qids if q in data.qrels}
    means, counts, per_query = score_run(run, qrels, list(measures), min_relevance)
    result = {"metrics": means, "counts": counts, "min_relevance": min_relevance,
              "seconds": {"encode_corpus": t1 - t0, "search": t2 - t1}}
    if out_dir is not None:
        out = Path(out_dir)
        write_trec_run(run, out / "run.trec", tag)
        (out / "metrics.json").write_text(json.dumps(result, indent=2))
        (out / "per_query.json").write_text(json.dumps(per_query, indent=2))
    return result
