"""The one in-memory form every retrieval reader produces: corpus, queries, graded qrels, negatives.

Readers (``beir.py``, ``tevatron.py``, ``dpr.py``) turn their file formats into ``RetrievalData``;
everything downstream (groups, training, evaluation) only sees this. Problems in the input either
raise a ``ValueError`` naming the file and line, or are counted in ``skipped`` (a manifest of
reason -> count) when the rest of the data is still usable (e.g. a judgment for a missing doc).
Every id of every reader is read through :class:`UniqueIds`: two different records under one id
are an error naming both lines (keeping either would change the results silently), an exact repeat
is kept once and counted; a query with empty text is counted, never scored.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, TextIO

from gsdistill.errors import InputError

# "utf-8-sig": a byte-order mark that Excel or Notepad put first is not part of the first field
# (it made a qrels header a bad grade, and the first judgement's query id unknown)
TEXT_ENCODING = "utf-8-sig"


@dataclass
class RetrievalData:
    doc_ids: list[str]
    doc_texts: list[str]
    queries: dict[str, str]  # qid -> text
    qrels: dict[str, dict[str, float]]  # qid -> {docid: grade}; grade > 0 relevant, 0 judged non-relevant
    negatives: dict[str, list[str]] = field(default_factory=dict)  # qid -> hard-negative doc ids
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.doc_ids) != len(self.doc_texts):
            raise ValueError(f"{self.source}: {len(self.doc_ids)} doc ids but {len(self.doc_texts)} texts")
        self.doc_index = {d: i for i, d in enumerate(self.doc_ids)}
        if len(self.doc_index) != len(self.doc_ids):
            raise ValueError(f"{self.source}: duplicate document ids in the corpus")

    def judged_queries(self) -> list[str]:
        """Query ids with at least one relevant doc (grade > 0), sorted (stable across runs)."""
        return sorted(q for q, g in self.qrels.items() if q in self.queries and any(v > 0 for v in g.values()))

    def subset(self, qids: list[str]) -> "RetrievalData":
        """Same corpus, only the given queries (for train / test folds)."""
        keep = set(qids)
        return RetrievalData(self.doc_ids, self.doc_texts, {q: t for q, t in self.queries.items() if q in keep},
                             {q: dict(g) for q, g in self.qrels.items() if q in keep},
                             {q: list(n) for q, n in self.negatives.items() if q in keep},
                             Counter(self.skipped), self.source)

    def summary(self) -> dict:
        """Counts of what was loaded and of everything left out (never silently): judged queries
        whose judgements are all grade 0 cannot be trained or scored and are counted here."""
        n_pos = [sum(1 for v in g.values() if v > 0) for g in self.qrels.values()]
        judged = set(self.judged_queries())
        no_rel = sorted(q for q in self.qrels if q in self.queries and q not in judged)
        return {"source": self.source, "docs": len(self.doc_ids), "queries": len(self.queries),
                "judged_queries": len(judged), "positives": sum(n_pos),
                "judgements": sum(len(g) for g in self.qrels.values()),
                "queries_without_relevant": len(no_rel), "queries_without_relevant_examples": no_rel[:10],
                "queries_without_judgements": len([q for q in self.queries if q not in self.qrels]),
                "relevant_means": "grade > 0", "skipped": dict(self.skipped)}

    def require_usable(self) -> None:
        """Empty corpus or no judgement at all: an error, not metrics of 0.0."""
        if not self.doc_ids:
            raise ValueError(f"{self.source}: the corpus is empty")
        if not any(self.qrels.values()):
            raise ValueError(f"{self.source}: no relevance judgements (qrels empty or none matches the corpus "
                             f"and queries; skipped: {dict(self.skipped)})")


@contextmanager
def open_text(path: str | Path) -> Iterator[TextIO]:
    """A UTF-8 text file to read (a leading byte-order mark dropped); bytes that are not UTF-8 are a
    ValueError naming the file, also when they come up while the caller reads."""
    try:
        with open(path, encoding=TEXT_ENCODING) as f:
            yield f
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` per non-empty line; bad JSON -> ValueError naming file and line."""
    with open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
            yield n, obj


def require(obj: dict, key: str, where: str):
    if key not in obj:
        raise ValueError(f"{where}: missing field '{key}' (has {sorted(obj)})")
    return obj[key]


def passage_text(title: str | None, text: str | None) -> str:
    """Title and body joined as BEIR's dense models do ("title text")."""
    return " ".join(t.strip() for t in (title, text) if t and t.strip())


class UniqueIds:
    """Records keyed by id in file order: ``add(id, value, line)`` is True for a new id, False for an
    exact repeat (kept once, counted in ``repeats``); a different value under a known id is an
    :class:`InputError` naming the file, the id and both lines (``unit``: "line", or "item" in a JSON list)."""

    def __init__(self, path: str | Path, what: str, unit: str = "line") -> None:
        self.path, self.what, self.unit = path, what, unit
        self.index: dict = {}  # id -> position in values
        self.values: list = []
        self.lines: list[int] = []
        self.repeats = 0

    def add(self, key, value, line: int) -> bool:
        i = self.index.get(key)
        if i is None:
            self.index[key] = len(self.values)
            self.values.append(value)
            self.lines.append(line)
            return True
        if self.values[i] != value:
            name = " ".join(map(str, key)) if isinstance(key, tuple) else key
            raise InputError(f"{self.path}: {self.what} {name!r} has two different records ({self.unit}s "
                             f"{self.lines[i]} and {line}); keep one of them, or give the other its own id")
        self.repeats += 1
        return False

    def count_repeats(self, skipped: Counter, name: str) -> None:
        if self.repeats:
            skipped[f"{name}: exact repeat of a record (kept once)"] += self.repeats


def empty_text(text) -> bool:
    """A query with nothing to encode: scoring it would rank the corpus for an empty string."""
    return not str(text).strip()


class CorpusBuilder:
    """Collects passages that arrive inline (DPR, Tevatron) and gives each a stable id; a passage id
    given again with another text is an error naming both places (the first text would win silently)."""

    def __init__(self, path: str | Path = "", unit: str = "line") -> None:
        self._docs = UniqueIds(path, "passage id", unit)

    @property
    def ids(self) -> list[str]:
        return list(self._docs.index)

    @property
    def texts(self) -> list[str]:
        return self._docs.values

    def count_repeats(self, skipped: Counter, name: str) -> None:
        """For a corpus file (one line per passage); inline passages cited again are no repeats."""
        self._docs.count_repeats(skipped, name)

    def add(self, text: str, doc_id: str | None = None, line: int = 0) -> str:
        if doc_id is None:  # no id in the file: content hash, so one passage gets one id
            doc_id = "h" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]
        doc_id = str(doc_id)
        self._docs.add(doc_id, text, line)  # a passage shared by queries is a reference, not a repeat
        return doc_id
