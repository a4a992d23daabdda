"""BEIR layout: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv`` (graded scores).

A split is a name (``train``, ``dev``, ``test`` -> ``qrels/<split>.tsv``) or a ``.tsv`` path
relative to the folder (e.g. NFCorpus's ``extras/train_graded_orig.tsv``, train with its original
grades), so training, selection and test judgements all come from one folder.

The qrels file may or may not start with a header line; a header is recognised by its column names
(``query-id corpus-id score``, ``qid docid rel``, ...), never by a grade that fails to parse, so a
malformed first judgement is an error, not a skipped header. It may have 3 columns (BEIR) or 4
(TREC: ``qid iter docid grade``). Grades are kept as floats (0.5 stays 0.5; a doc is relevant when
its grade is > 0). Judgments naming a doc that is not in the corpus, or a query that is not in
queries.jsonl, are counted in ``skipped``, not silently dropped; an empty corpus or no usable
judgement is an error. A document, query or (query, document) judgement given twice with different
contents is an error naming both lines; an exact repeat is kept once and counted in ``skipped``. A
query with empty text is counted in ``skipped`` with its judgements, never scored.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from gsdistill.retriever.data import RetrievalData, UniqueIds, empty_text, open_text, passage_text, read_jsonl, require

QUERY_COLUMNS = {"query-id", "query_id", "queryid", "qid", "query", "topic", "topic_id", "topic-id"}
DOC_COLUMNS = {"corpus-id", "corpus_id", "doc-id", "doc_id", "docid", "docno", "document", "pid", "passage_id"}
GRADE_COLUMNS = {"score", "grade", "rel", "relevance", "label", "judgment", "judgement"}


def is_header(parts: list[str]) -> bool:
    """A header names its columns: query column, (iteration,) document column, grade column."""
    names = [p.strip().lower() for p in parts]
    return names[0] in QUERY_COLUMNS and names[-2] in DOC_COLUMNS and names[-1] in GRADE_COLUMNS


def read_qrels(path: str | Path, skipped: Counter | None = None) -> dict[str, dict[str, float]]:
    """``{qid: {docid: grade}}`` from a BEIR (3-column) or TREC (4-column) qrels file; exact repeats
    of a judgement are counted in ``skipped`` (when given), another grade for it is an error."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: qrels file not found")
    qrels: dict[str, dict[str, int]] = {}
    pairs = UniqueIds(path, "judgement (query, document)")
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.strip().split("\t") if "\t" in line else line.split()
            if not parts or not line.strip():
                continue
            if len(parts) not in (3, 4):
                raise ValueError(f"{path}:{n}: expected 3 (qid docid grade) or 4 (qid iter docid grade) "
                                 f"columns, got {len(parts)}")
            if n == 1 and is_header(parts):
                continue
            qid, docid, grade = (parts[0], parts[1], parts[2]) if len(parts) == 3 else (parts[0], parts[2], parts[3])
            try:
                value = float(grade)
            except ValueError:
                raise ValueError(f"{path}:{n}: relevance grade '{grade}' is not a number") from None
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"{path}:{n}: relevance grade '{grade}' is not finite")
            if value.is_integer():  # 0/1/2 stay ints (what pytrec_eval expects); 0.5 stays 0.5
                value = int(value)
            if pairs.add((qid, docid), value, n):
                qrels.setdefault(qid, {})[docid] = value
    pairs.count_repeats(skipped if skipped is not None else Counter(), path.name)
    return qrels


def qrels_path(folder: Path, split: str) -> Path:
    """``qrels/<split>.tsv``, or ``<folder>/<split>`` when the split is itself a ``.tsv`` path."""
    split = str(split)
    return folder / split if split.endswith(".tsv") else folder / "qrels" / f"{split}.tsv"


def load_beir(folder: str | Path, split: str = "test") -> RetrievalData:
    """Read a BEIR data set folder; ``split`` names ``qrels/<split>.tsv`` or a ``.tsv`` in the folder."""
    folder = Path(folder)
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (folder / name).is_file():
            raise ValueError(f"{folder}: not a BEIR folder (no {name})")
    docs, skipped = UniqueIds(folder / "corpus.jsonl", "document id"), Counter()
    for n, obj in read_jsonl(folder / "corpus.jsonl"):
        where = f"{folder / 'corpus.jsonl'}:{n}"
        docs.add(str(require(obj, "_id", where)), passage_text(obj.get("title"), require(obj, "text", where)), n)
    docs.count_repeats(skipped, "corpus.jsonl")
    doc_ids, doc_texts = list(docs.index), docs.values
    del docs  # RetrievalData builds its own index: one id table in memory at a time
    read = UniqueIds(folder / "queries.jsonl", "query id")
    for n, obj in read_jsonl(folder / "queries.jsonl"):
        where = f"{folder / 'queries.jsonl'}:{n}"
        read.add(str(require(obj, "_id", where)), str(require(obj, "text", where)), n)
    read.count_repeats(skipped, "queries.jsonl")
    empty = {q for q, t in zip(read.index, read.values) if empty_text(t)}
    queries = {q: t for q, t in zip(read.index, read.values) if q not in empty}
    if empty:
        skipped["queries.jsonl: query with empty text (not scored)"] += len(empty)
    raw = read_qrels(qrels_path(folder, split), skipped)
    doc_set, qrels = set(doc_ids), {}
    for qid, grades in raw.items():
        if qid in empty:
            skipped["qrels query with empty text in queries.jsonl"] += 1
            continue
        if qid not in queries:
            skipped["qrels query not in queries.jsonl"] += 1
            continue
        for docid, grade in grades.items():
            if docid in doc_set:
                qrels.setdefault(qid, {})[docid] = grade
            else:
                skipped["qrels doc not in corpus.jsonl"] += 1
    data = RetrievalData(doc_ids, doc_texts, queries, qrels, {}, skipped, str(folder))
    data.require_usable()
    return data
