"""Pick a reader by format name, split judged queries into folds by a fixed seed, or draw a few."""
from __future__ import annotations

import random
from pathlib import Path

from gsdistill.retriever.data import RetrievalData

FORMATS = ("beir", "tevatron", "dpr")


def load_retrieval_data(fmt: str, path: str | Path, corpus: str | Path | None = None,
                        split: str = "test") -> RetrievalData:
    """``fmt`` in beir | tevatron | dpr; ``corpus`` is the Tevatron document-id style corpus."""
    if path is None or str(path) == "":
        raise ValueError("data.path is empty: name a BEIR folder, a Tevatron JSONL or a DPR JSON file")
    if fmt == "beir":
        from gsdistill.retriever.beir import load_beir
        return load_beir(path, split)
    if fmt == "tevatron":
        from gsdistill.retriever.tevatron import load_tevatron
        return load_tevatron(path, corpus)
    if fmt == "dpr":
        from gsdistill.retriever.dpr import load_dpr
        return load_dpr(path)
    raise ValueError(f"unknown data format {fmt!r}; expected one of {', '.join(FORMATS)}")


def split_folds(qids: list[str], n_folds: int, seed: int) -> list[list[str]]:
    """Shuffle ``sorted(qids)`` with ``seed`` and deal them into ``n_folds`` near-equal folds."""
    if n_folds < 2 or n_folds > len(qids):
        raise ValueError(f"need 2 <= folds <= {len(qids)} queries, got folds={n_folds}")
    order = sorted(qids)
    random.Random(seed).shuffle(order)
    return [order[i::n_folds] for i in range(n_folds)]


def train_test_queries(data: RetrievalData, n_folds: int, fold: int, seed: int) -> tuple[list[str], list[str]]:
    """Judged queries of every fold but ``fold`` (train) and of ``fold`` (test)."""
    folds = split_folds(data.judged_queries(), n_folds, seed)
    if not 0 <= fold < n_folds:
        raise ValueError(f"fold must be in [0, {n_folds - 1}], got {fold}")
    train = sorted(q for i, f in enumerate(folds) if i != fold for q in f)
    return train, sorted(folds[fold])


def limit_queries(data: RetrievalData, n: int, seed: int) -> RetrievalData:
    """``n`` judged queries of ``data`` drawn with ``seed`` (all of them when ``n`` is 0 or too large)."""
    judged = sorted(data.judged_queries())
    if n <= 0 or n >= len(judged):
        return data
    return data.subset(sorted(random.Random(seed).sample(judged, n)))
