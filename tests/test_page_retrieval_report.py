"""Page-retrieval tables and plot; document-level held-out splits."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from PIL import Image

from gsdistill.eval import page_report, splits
from gsdistill.eval.page_retrieval import evaluate_page_retrieval
from test_page_retrieval import FakeTextEncoder, _cfg, _model_for, _pages


def test_report_tables_csv_and_plot(tmp_path):
    pages = _pages(40)
    results = {name: evaluate_page_retrieval(_model_for(pages, noise), pages, FakeTextEncoder(),
                                             _cfg(ks=[1, 4], seeds=[0, 1, 2]), progress=False)
               for name, noise in (("SP", 2.0), ("MPCL", 0.5))}
    paths = page_report.write_report(results, tmp_path / "out")
    rows = list(csv.DictReader(open(paths["csv"])))
    assert len(rows) == 2 * 2 * 2  # models x scorings x k
    row = next(r for r in rows if r["model"] == "MPCL" and r["scoring"] == "multi_positive" and r["k"] == "4")
    want = results["MPCL"]["summary"]["multi_positive"][4]["Acc@1"]
    assert float(row["Acc@1_mean"]) == pytest.approx(want["mean"]) and row["seeds"] == "3"
    table = paths["table"].read_text()
    cell = f"{100 * want['mean']:.1f} ± {100 * want['std']:.1f}"
    line = next(ln for ln in table.splitlines() if ln.startswith("| MPCL | per crop"))
    assert line.split("|")[4].strip() == cell
    assert "gallery 40 pages from 10 documents (chance 2.50%)" in table
    paired = next(ln for ln in table.splitlines() if ln.startswith("| MPCL multi_positive − SP single_positive |"))
    d = page_report.paired_difference(results, ("SP", "single_positive"), ("MPCL", "multi_positive"), 4)
    assert paired.split("|")[3].strip().startswith(f"{100 * d['diff']:+.1f} [")
    assert Image.open(paths["plot"]).size[0] > 300
    assert json.loads(paths["json"].read_text())["SP"]["n_gallery"] == 40


def test_split_documents_disjoint_deterministic():
    docs = [f"doc{i}" for i in range(50)] * 3  # repeated ids: one document, many pages
    train, held = splits.split_documents(docs, 0.2, seed=1)
    assert len(held) == 10 and len(train) == 40 and not set(train) & set(held)
    assert (train, held) == splits.split_documents(reversed(docs), 0.2, seed=1)
    assert held != splits.split_documents(docs, 0.2, seed=2)[1]
    assert len(splits.split_documents(["a", "b"], 0.01)[1]) == 1   # at least one held out
    assert len(splits.split_documents(["a", "b"], 0.99)[0]) == 1   # at least one kept
    with pytest.raises(ValueError, match="at least 2 documents"):
        splits.split_documents(["a", "a"], 0.5)
    with pytest.raises(ValueError, match="eval_fraction"):
        splits.split_documents(docs, 1.0)


def test_check_held_out_names_shared_documents():
    splits.check_held_out({"a", "b"}, {"c"})
    with pytest.raises(ValueError, match=r"2 document\(s\) also in the pretraining data \(a, b\)"):
        splits.check_held_out({"a", "b", "x"}, {"a", "b", "c"})


def test_split_shards_round_trip(tmp_path):
    from gsdistill.tuples.store import reader, writer
    pages = _pages(24)
    for p in pages:
        p["source"] = "test"
    writer.write_shards(pages, tmp_path / "all", pages_per_shard=8)
    rec = splits.split_shards(tmp_path / "all", tmp_path / "train", tmp_path / "eval", 0.34, seed=0,
                              pages_per_shard=8)
    train_docs, eval_docs = splits.document_ids(tmp_path / "train"), splits.document_ids(tmp_path / "eval")
    assert train_docs == set(rec["train_docs"]) and eval_docs == set(rec["eval_docs"])
    assert len(eval_docs) == 2 and not train_docs & eval_docs
    ids = sorted(p["id"] for d in ("train", "eval") for p in reader.read_pages(tmp_path / d))
    assert ids == sorted(p["id"] for p in pages)
    got = {p["id"]: p for p in reader.read_pages(tmp_path / "eval")}
    src = next(p for p in pages if p["id"] in got)
    assert [s["text"] for s in got[src["id"]]["spans"]] == [s["text"] for s in src["spans"]]
    assert np.array_equal(np.asarray(got[src["id"]]["image"]), np.asarray(src["image"]))


def test_paired_difference_against_hand_computation():
    res = {"A": {"page_ids": ["p", "q", "r", "s"], "summary": {"single_positive": {1: {}}},
                 "hits_at_1": {"single_positive": {1: {0: [1, 0, 0, 0], 1: [1, 1, 0, 0]}}}},
           "B": {"page_ids": ["p", "q", "r", "s"], "summary": {"multi_positive": {1: {}}},
                 "hits_at_1": {"multi_positive": {1: {0: [1, 1, 1, 0], 1: [1, 1, 0, 0]}}}}}
    d = page_report.paired_difference(res, ("A", "single_positive"), ("B", "multi_positive"), 1)
    # per query: A = [1, .5, 0, 0], B = [1, 1, .5, 0] -> diff [0, .5, .5, 0], mean .25
    assert d["diff"] == pytest.approx(0.25) and 0.0 <= d["ci95"][0] <= 0.25 <= d["ci95"][1] <= 0.5
    res["B"]["page_ids"] = ["p", "q", "r", "x"]
    with pytest.raises(ValueError, match="same gallery"):
        page_report.paired_difference(res, ("A", "single_positive"), ("B", "multi_positive"), 1)


def test_paired_difference_resamples_documents_not_pages():
    # 10 documents of 4 pages: model B beats A on every page of documents 0-4 and on none of 5-9
    page_ids = [f"p{i}" for i in range(40)]
    hits_b = [1 if i // 4 < 5 else 0 for i in range(40)]

    def result(hits, doc_ids):
        return {"page_ids": page_ids, "doc_ids": doc_ids, "hits_at_1": {"multi_positive": {1: {0: hits}}}}
    docs = [f"d{i // 4}" for i in range(40)]
    by_doc = page_report.paired_difference({"A": result([0] * 40, docs), "B": result(hits_b, docs)},
                                           ("A", "multi_positive"), ("B", "multi_positive"), 1)
    by_page = page_report.paired_difference({"A": result([0] * 40, page_ids), "B": result(hits_b, page_ids)},
                                            ("A", "multi_positive"), ("B", "multi_positive"), 1)
    assert by_doc["diff"] == by_page["diff"] == 0.5 and by_doc["n_docs"] == 10
    width = lambda d: d["ci95"][1] - d["ci95"][0]  # noqa: E731
    assert width(by_doc) > 1.5 * width(by_page)  # correlated pages: the honest interval is wider
