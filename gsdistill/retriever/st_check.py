"""A saved retriever scored through sentence-transformers' own encode: what a user of the folder gets.

``SentenceTransformer(model_dir)`` opens a saved :class:`~gsdistill.retriever.model.DualEncoder`
(a shared tower is one model; separate towers are a ``Router`` over ``query_encoder/`` and
``passage_encoder/``, see ``st_format.py``). Queries go through ``encode_query``, the corpus through
``encode_document``, then the same exact search and metrics as ``evaluate_retriever``; equal
metrics mean the saved folder reproduces the model's reported numbers outside this project.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gsdistill.retriever.data import RetrievalData
from gsdistill.retriever.evaluate import run_from_embeddings, score_run


def sentence_transformers_metrics(model_dir: str | Path, data: RetrievalData, measures: list[str], k: int = 1000,
                                  batch_size: int = 64, min_relevance: float = 1.0) -> dict[str, float]:
    """Mean metrics over the judged queries of ``data`` with embeddings from sentence-transformers."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu")
    qids = data.judged_queries()
    q_emb = torch.as_tensor(st.encode_query([data.queries[q] for q in qids], batch_size=batch_size))
    doc_emb = torch.as_tensor(st.encode_document(data.doc_texts, batch_size=batch_size))
    run = run_from_embeddings(data, qids, q_emb, doc_emb, k)
    return score_run(run, {q: data.qrels[q] for q in qids}, list(measures), min_relevance)[0]
