"""Readers (BEIR, Tevatron both styles, DPR), folds and label-noise injection."""
from __future__ import annotations

import json

import pytest
import torch

from gsdistill.retriever.beir import load_beir, read_qrels
from gsdistill.retriever.dpr import load_dpr
from gsdistill.retriever.loading import load_retrieval_data, split_folds, train_test_queries
from gsdistill.retriever.noise import inject_label_noise
from gsdistill.retriever.tevatron import load_tevatron
from retriever_fixtures import tiny_beir, write_beir  # noqa: F401  (fixture)


@pytest.mark.parametrize("header", [True, False])
def test_beir_qrels_with_and_without_header(tmp_path, header):
    data = load_beir(write_beir(tmp_path / "b", header=header))
    assert len(data.doc_ids) == 30 and len(data.queries) == 6
    assert data.qrels["q-cat"] == {"cat-0": 2, "cat-1": 1, "cat-2": 1, "filler-0": 0}
    assert sum(len(g) for g in data.qrels.values()) == 24  # no line lost to header detection
    assert data.doc_texts[0] == "Cat The cat is a small domesticated carnivorous mammal kept as a pet."


def test_trec_qrels_and_bad_lines(tmp_path):
    p = tmp_path / "q.txt"
    p.write_text("q1 0 d1 2\nq1 0 d2 0\nq2 0 d3 1\n")
    assert read_qrels(p) == {"q1": {"d1": 2, "d2": 0}, "q2": {"d3": 1}}
    p.write_text("q1\td1\t1\nq1\td2\thigh\n")
    with pytest.raises(ValueError, match=r"q.txt:2: relevance grade 'high'"):
        read_qrels(p)


def test_beir_missing_docs_are_counted_and_bad_json_named(tiny_beir):
    with open(tiny_beir / "qrels" / "test.tsv", "a") as f:
        f.write("q-cat\tno-such-doc\t1\nq-unknown\tcat-0\t1\n")
    data = load_beir(tiny_beir)
    assert data.skipped == {"qrels doc not in corpus.jsonl": 1, "qrels query not in queries.jsonl": 1}
    assert "no-such-doc" not in data.qrels["q-cat"]
    with open(tiny_beir / "corpus.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(ValueError, match=r"corpus.jsonl:31: not valid JSON"):
        load_beir(tiny_beir)


def test_tevatron_inline_style(tmp_path):
    p = tmp_path / "train.jsonl"
    rows = [{"query_id": "1", "query": "capital of france",
             "positive_passages": [{"docid": "d1", "title": "Paris", "text": "Paris is the capital."}],
             "negative_passages": [{"docid": "d2", "title": "Rome", "text": "Rome is in Italy."},
                                   {"docid": "d3", "title": "", "text": "Berlin."}]},
            {"query_id": "2", "query": "italian capital",
             "positive_passages": [{"docid": "d2", "title": "Rome", "text": "Rome is in Italy."}],
             "negative_passages": [{"docid": "d1", "title": "Paris", "text": "Paris is the capital."}]}]
    p.write_text("\n".join(json.dumps(r) for r in rows))
    data = load_tevatron(p)
    assert data.doc_ids == ["d1", "d2", "d3"] and data.doc_texts[0] == "Paris Paris is the capital."
    assert data.qrels == {"1": {"d1": 1}, "2": {"d2": 1}}
    assert data.negatives == {"1": ["d2", "d3"], "2": ["d1"]}
    assert data.queries["2"] == "italian capital"


def test_tevatron_document_id_style(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in [
        {"docid": "a", "document_text": "alpha text"}, {"docid": "b", "title": "B", "text": "beta text"},
        {"docid": "c", "document_text": "gamma"}]))
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"query_id": "q", "query_text": "alpha?", "positive_document_ids": ["a"],
                                 "negative_document_ids": ["b", "zzz"]}) + "\n")
    data = load_retrieval_data("tevatron", train, corpus)
    assert data.qrels == {"q": {"a": 1}} and data.negatives == {"q": ["b"]}
    assert data.doc_texts[1] == "B beta text"
    assert data.skipped == {"document id not in corpus": 1}
    with pytest.raises(ValueError, match="needs a corpus JSONL: set data.corpus"):
        load_tevatron(train)


def test_dpr_json(tmp_path):
    p = tmp_path / "dpr.json"
    p.write_text(json.dumps([
        {"question": "who wrote hamlet", "answers": ["Shakespeare"],
         "positive_ctxs": [{"title": "Hamlet", "text": "Hamlet is a play by Shakespeare.", "passage_id": "11"},
                           {"title": "Shakespeare", "text": "He wrote Hamlet.", "passage_id": "12"}],
         "negative_ctxs": [{"title": "X", "text": "random"}],
         "hard_negative_ctxs": [{"title": "Macbeth", "text": "Macbeth is a play.", "passage_id": "13"}]},
        {"question": "who wrote macbeth", "answers": ["Shakespeare"],
         "positive_ctxs": [{"title": "Macbeth", "text": "Macbeth is a play.", "passage_id": "13"}],
         "hard_negative_ctxs": []}]))
    data = load_dpr(p)
    assert data.qrels["q0"] == {"11": 1, "12": 1} and data.qrels["q1"] == {"13": 1}
    assert data.negatives["q0"][0] == "13" and data.negatives["q0"][1].startswith("h")
    assert len(data.doc_ids) == 4  # passage 13 shared by both questions is one doc
    p.write_text(json.dumps({"question": "x"}))
    with pytest.raises(ValueError, match="JSON list of questions"):
        load_dpr(p)


def test_folds_are_fixed_disjoint_and_cover(tiny_beir):
    data = load_beir(tiny_beir)
    folds = split_folds(data.judged_queries(), 3, seed=7)
    assert folds == split_folds(data.judged_queries(), 3, seed=7)
    assert sorted(q for f in folds for q in f) == data.judged_queries() and all(len(f) == 2 for f in folds)
    train, test = train_test_queries(data, 3, 1, 7)
    assert set(train).isdisjoint(test) and sorted(test) == sorted(folds[1])
    assert split_folds(data.judged_queries(), 3, seed=8) != folds


def test_noise_replaces_positives_by_nearest_non_relevant(tiny_beir):
    data = load_beir(tiny_beir)
    n_docs = len(data.doc_ids)
    # embeddings: each doc nearest to the next doc id in corpus order (one-hot chain)
    emb = torch.eye(n_docs) + 0.5 * torch.roll(torch.eye(n_docs), 1, dims=1)
    noisy, stats = inject_label_noise(data, 1.0, emb, seed=0)
    assert stats == {"positives": 18, "chosen": 18, "replaced": 18, "kept_no_candidate": 0,
                     "requested_rate": 1.0, "achieved_rate": 1.0}
    for q, grades in noisy.items():
        relevant = {d for d, g in data.qrels[q].items() if g >= 1}
        assert sum(g >= 1 for g in grades.values()) == 3 and not relevant & {d for d, g in grades.items() if g >= 1}
    half, stats = inject_label_noise(data, 0.3, emb, seed=1)
    assert stats["chosen"] == round(0.3 * 18) and half != noisy
    assert stats["achieved_rate"] == pytest.approx(5 / 18)  # every chosen positive replaced
    assert inject_label_noise(data, 0.3, emb, seed=1)[0] == half
    assert data.qrels["q-cat"]["cat-0"] == 2  # the input is not modified
    with pytest.raises(ValueError, match="ratio"):
        inject_label_noise(data, 1.5)


def test_noise_reaches_the_requested_rate_when_the_nearest_docs_are_relevant(tiny_beir):
    data = load_beir(tiny_beir)
    # every topical doc sits at its topic's point; fillers far away: a positive's nearest docs are
    # the other positives of its query, and only the farthest docs (fillers) may replace it
    topics = sorted({d.split("-")[0] for d in data.doc_ids if not d.startswith("filler")})
    emb = torch.zeros(len(data.doc_ids), len(topics) + 1)
    for i, d in enumerate(data.doc_ids):
        emb[i, topics.index(d.split("-")[0]) if not d.startswith("filler") else len(topics)] = 1.0
        emb[i] += 0.01 * i * (1 if d.startswith("filler") else 0)
    noisy, stats = inject_label_noise(data, 1.0, emb, seed=0)
    assert stats["achieved_rate"] == 1.0 and stats["replaced"] == 18
    for q, grades in noisy.items():
        swapped = {d for d, g in grades.items() if g > 0}
        assert all(data.qrels[q].get(d, 0) == 0 for d in swapped)  # judged non-relevant or unjudged
