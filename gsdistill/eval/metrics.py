"""IR metrics over TREC-style runs and graded qrels, equal to trec_eval / ir_measures.

A run is ``{qid: {docid: score}}``; qrels are ``{qid: {docid: grade}}`` (grade >= 1 is relevant,
graded gains for nDCG). Documents are ranked by score descending with ties broken by doc id
descending, which is trec_eval's order, so the numbers match ``pytrec_eval`` / ``ir_measures``
on the same run (tested).

Measures (``k`` any positive integer):
- ``MRR@k`` / ``MRR``: reciprocal rank of the first relevant doc within the top k (0 if none).
- ``R@k``: relevant docs in the top k / all relevant docs of the query.
- ``P@k``: relevant docs in the top k / k.
- ``nDCG@k``: sum_{i<=k} g_i / log2(i+1) over the ideal DCG from the qrels (gain = grade).
- ``Acc@k``: 1 if at least one relevant doc is in the top k (a.k.a. Success@k, top-k accuracy).

Which queries count: every qrels query with at least one relevant doc (queries missing from the
run score 0 on every measure); queries with no relevant doc cannot be scored and are counted in
``evaluate_with_counts``.
"""
from __future__ import annotations

import math
import re
from typing import Iterable, Mapping

DEFAULT_MEASURES = ("MRR@10", "R@20", "R@100", "R@1000", "nDCG@10", "Acc@20", "Acc@100")
_MEASURE = re.compile(r"^(MRR|R|P|nDCG|Acc)(?:@(\d+))?$")

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def parse_measure(name: str) -> tuple[str, int | None]:
    """``"nDCG@10"`` -> ``("nDCG", 10)``; ``"MRR"`` -> ``("MRR", None)``; else ValueError."""
    m = _MEASURE.match(name)
    if not m or (m.group(2) is None and m.group(1) not in ("MRR", "nDCG", "R")):
        raise ValueError(f"unknown IR measure '{name}'; expected one of MRR[@k], R[@k], P@k, nDCG[@k], Acc@k")
    k = int(m.group(2)) if m.group(2) else None
    if k == 0:
        raise ValueError(f"IR measure '{name}': cutoff must be >= 1")
    return m.group(1), k


def rank_documents(doc_scores: Mapping[str, float]) -> list[str]:
    """Doc ids by score descending, ties by doc id descending (trec_eval's order)."""
    return [d for d, _ in sorted(doc_scores.items(), key=lambda x: (-float(x[1]), _Desc(x[0])))]


class _Desc(str):
    """String ordered in reverse, so one ascending sort gives (score desc, docid desc)."""

    def __lt__(self, other: str) -> bool:  # type: ignore[override]
        return str.__gt__(self, other)


def _query_measure(kind: str, k: int | None, ranked: list[str], grades: Mapping[str, int]) -> float:
    n_rel = sum(1 for g in grades.values() if g >= 1)
    top = ranked if k is None else ranked[:k]
    if kind == "MRR":
        return next((1.0 / (i + 1) for i, d in enumerate(top) if grades.get(d, 0) >= 1), 0.0)
    if kind == "R":
        return sum(1 for d in top if grades.get(d, 0) >= 1) / n_rel
    if kind == "P":
        return sum(1 for d in top if grades.get(d, 0) >= 1) / k
    if kind == "Acc":
        return float(any(grades.get(d, 0) >= 1 for d in top))
    # nDCG: gains are the (positive) grades; the ideal ranking sorts the judged grades
    dcg = sum(max(grades.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(top))
    ideal = sorted((g for g in grades.values() if g > 0), reverse=True)
    ideal = ideal if k is None else ideal[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg


def evaluate_per_query(run: Run, qrels: Qrels, measures: Iterable[str] = DEFAULT_MEASURES
                       ) -> dict[str, dict[str, float]]:
    """``{qid: {measure: value}}`` for every qrels query with >= 1 relevant doc."""
    parsed = [(name, *parse_measure(name)) for name in measures]
    out: dict[str, dict[str, float]] = {}
    for qid, grades in qrels.items():
        if not any(g >= 1 for g in grades.values()):
            continue
        ranked = rank_documents(run.get(qid, {}))
        out[qid] = {name: _query_measure(kind, k, ranked, grades) for name, kind, k in parsed}
    return out


def evaluate_with_counts(run: Run, qrels: Qrels, measures: Iterable[str] = DEFAULT_MEASURES
                         ) -> tuple[dict[str, float], dict[str, int]]:
    """Mean metrics plus counts: queries scored, without relevant docs, missing from the run."""
    measures = list(measures)
    per_query = evaluate_per_query(run, qrels, measures)
    n = len(per_query)
    means = {m: (sum(v[m] for v in per_query.values()) / n if n else 0.0) for m in measures}
    counts = {"queries_scored": n,
              "queries_without_relevant": len(qrels) - n,
              "queries_missing_from_run": sum(1 for q in per_query if q not in run)}
    return means, counts


def evaluate(run: Run, qrels: Qrels, measures: Iterable[str] = DEFAULT_MEASURES) -> dict[str, float]:
    """Mean of each measure over the qrels queries with >= 1 relevant doc (see module doc)."""
    return evaluate_with_counts(run, qrels, measures)[0]
