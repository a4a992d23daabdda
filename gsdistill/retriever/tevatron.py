"""Tevatron training JSONL, both styles.

- passages inline (Tevatron v1): one line per query
  ``{"query_id", "query", "positive_passages": [{"docid", "title", "text"}], "negative_passages": [...]}``
- document ids (Tevatron v2): ``{"query_id", "query_text", "positive_document_ids": [...],
  "negative_document_ids": [...]}`` plus a corpus JSONL ``{"docid", "document_text" | "text", "title"?}``.

Positives get grade 1 in the qrels; negatives become the query's hard negatives. A query id, corpus
document id or inline passage id given twice with different contents is an error naming both lines;
an exact repeat of a training line is kept once and counted, a query with empty text counted and left out.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from gsdistill.retriever.data import (
    CorpusBuilder, RetrievalData, UniqueIds, empty_text, passage_text, read_jsonl, require,
)


def _inline_passage(corpus: CorpusBuilder, p: dict, where: str, n: int) -> str:
    if not isinstance(p, dict):
        raise ValueError(f"{where}: a passage must be an object, got {type(p).__name__}")
    return corpus.add(passage_text(p.get("title"), require(p, "text", where)), p.get("docid"), n)


def _read_corpus(path: Path) -> CorpusBuilder:
    corpus = CorpusBuilder(path)
    for n, obj in read_jsonl(path):
        where = f"{path}:{n}"
        text = obj.get("document_text", obj.get("text"))
        if text is None:
            raise ValueError(f"{where}: corpus line has neither 'document_text' nor 'text'")
        corpus.add(passage_text(obj.get("title"), text), str(require(obj, "docid", where)), n)
    return corpus


def load_tevatron(train_path: str | Path, corpus_path: str | Path | None = None) -> RetrievalData:
    """Read either style; the doc-id style needs ``corpus_path``."""
    train_path = Path(train_path)
    if not train_path.is_file():
        raise ValueError(f"{train_path}: Tevatron file not found")
    lines = list(read_jsonl(train_path))
    if not lines:
        raise ValueError(f"{train_path}: no training lines")
    id_style = "positive_document_ids" in lines[0][1]
    corpus = CorpusBuilder(train_path)
    doc_set: set[str] = set()
    if id_style:
        if corpus_path is None:
            raise ValueError(f"{train_path}: document-id style Tevatron data needs a corpus JSONL: set data.corpus")
        corpus = _read_corpus(Path(corpus_path))
        doc_set = set(corpus.ids)
    queries, qrels, negatives, skipped = {}, {}, {}, Counter()
    records = UniqueIds(train_path, "query_id")
    for n, obj in lines:
        where = f"{train_path}:{n}"
        qid = str(obj.get("query_id", f"q{n}"))
        if id_style:
            text = str(require(obj, "query_text", where))
            pos = [str(d) for d in require(obj, "positive_document_ids", where)]
            neg = [str(d) for d in obj.get("negative_document_ids", [])]
            missing = [d for d in pos + neg if d not in doc_set]
            pos, neg = [d for d in pos if d in doc_set], [d for d in neg if d in doc_set]
        else:
            text, missing = str(require(obj, "query", where)), []
            pos = [_inline_passage(corpus, p, where, n) for p in require(obj, "positive_passages", where)]
            neg = [_inline_passage(corpus, p, where, n) for p in obj.get("negative_passages", [])]
        if not records.add(qid, (text, pos, neg), n):
            continue  # an exact repeat of an earlier line: counted below
        skipped["document id not in corpus"] += len(missing)
        if empty_text(text):
            skipped["query with empty text (not scored)"] += 1
            continue
        if not pos:
            skipped["query without positive passage"] += 1
        queries[qid] = text
        qrels[qid] = {d: 1 for d in pos}
        negatives[qid] = [d for d in neg if d not in qrels[qid]]
    records.count_repeats(skipped, train_path.name)
    if id_style:
        corpus.count_repeats(skipped, Path(corpus_path).name)
    skipped = Counter({k: v for k, v in skipped.items() if v})
    data = RetrievalData(corpus.ids, corpus.texts, queries, qrels, negatives, skipped, str(train_path))
    data.require_usable()
    return data
