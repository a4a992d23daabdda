"""DPR training/dev JSON: a list of ``{"question", "answers", "positive_ctxs", "negative_ctxs",
"hard_negative_ctxs"}`` where each ctx is ``{"title", "text", "passage_id"?}``.

Positives get grade 1; hard negatives come first in the negatives list, then plain negatives.
Passages without ``passage_id`` get a content-hash id, so a passage shared by questions is one doc.
A question id or passage id given twice with different contents is an error naming both items; an
exact repeat of an item is kept once and counted, a question with empty text counted and left out.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from gsdistill.retriever.data import (
    CorpusBuilder, RetrievalData, UniqueIds, empty_text, open_text, passage_text, require,
)


def load_dpr(path: str | Path) -> RetrievalData:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: DPR file not found")
    try:
        with open_text(path) as f:
            items = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(items, list):
        raise ValueError(f"{path}: a DPR file is a JSON list of questions, got {type(items).__name__}")
    corpus, skipped = CorpusBuilder(path, unit="item"), Counter()
    queries, qrels, negatives = {}, {}, {}
    records = UniqueIds(path, "question id", unit="item")
    for i, item in enumerate(items):
        where = f"{path}: item {i}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected an object")
        qid = str(item.get("id", item.get("qid", f"q{i}")))

        def add(ctx: dict) -> str:
            if not isinstance(ctx, dict):
                raise ValueError(f"{where}: a ctx must be an object")
            pid = ctx.get("passage_id", ctx.get("psg_id"))
            return corpus.add(passage_text(ctx.get("title"), require(ctx, "text", where)),
                              None if pid is None else str(pid), i)

        text = str(require(item, "question", where))
        pos = [add(c) for c in require(item, "positive_ctxs", where)]
        neg = [add(c) for c in item.get("hard_negative_ctxs", []) + item.get("negative_ctxs", [])]
        if not records.add(qid, (text, pos, neg), i):
            continue  # an exact repeat of an earlier item: counted below
        if empty_text(text):
            skipped["question with empty text (not scored)"] += 1
            continue
        if not pos:
            skipped["question without positive_ctxs"] += 1
        queries[qid] = text
        qrels[qid] = {d: 1 for d in pos}
        negatives[qid] = list(dict.fromkeys(d for d in neg if d not in qrels[qid]))
    records.count_repeats(skipped, path.name)
    data = RetrievalData(corpus.ids, corpus.texts, queries, qrels, negatives, skipped, str(path))
    data.require_usable()
    return data
