"""Hard-negative mining: BM25 / dense rankings, judged-relevant exclusion, false-negative guard,
cache keyed by what produced the lists, per-epoch re-mining, and the sampler using them."""
from __future__ import annotations

import json

import pytest
import torch

from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.groups import GroupSampler
from gsdistill.retriever.mining import (
    bm25_rankings, cached_negatives, dense_rankings, interleave, mine_negatives, mining_key, select_negatives,
)
from gsdistill.retriever.pipeline import train_and_evaluate
from gsdistill.retriever.train import RetrieverTrainer
from retriever_fixtures import retriever_cfg, tiny_beir, tiny_encoder  # noqa: F401  (fixtures)


def test_select_negatives_excludes_relevant_and_skips_the_guard():
    ranked = [5, 1, 7, 2, 9, 3, 8]
    assert select_negatives(ranked, {1, 2}, skip_top=0, per_query=3) == [5, 7, 9]
    assert select_negatives(ranked, {1, 2}, skip_top=2, per_query=3) == [9, 3, 8]
    assert interleave([1, 2, 3], [2, 4]) == [1, 2, 4, 3]


def test_bm25_scores_equal_the_okapi_formula_by_hand():
    import bm25s
    import math

    docs = ["the cat sat on the mat", "dogs chase cats", "a cat and a cat", "stock market news"]
    ranked = bm25_rankings(docs, ["cat", "market", "zebra"], depth=4)
    assert ranked == [[2, 0], [3], []]  # docs without a query term are left out
    # bm25s' default (Lucene) BM25, k1 = 1.5, b = 0.75, stop words removed ("the", "on", "a", "and")
    tokens = [["cat", "sat", "mat"], ["dogs", "chase", "cats"], ["cat", "cat"], ["stock", "market", "news"]]
    avg = sum(map(len, tokens)) / 4
    idf = math.log(1 + (4 - 2 + 0.5) / (2 + 0.5))  # "cat" is in 2 of 4 docs
    by_hand = [idf * t.count("cat") / (t.count("cat") + 1.5 * (1 - 0.75 + 0.75 * len(t) / avg)) for t in tokens]
    index = bm25s.BM25()
    index.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
    ids, scores = index.retrieve([["cat"]], k=2, show_progress=False)
    assert ids[0].tolist() == [2, 0]
    assert scores[0].tolist() == pytest.approx([by_hand[2], by_hand[0]], rel=1e-5)


def test_mined_lists_never_hold_a_judged_relevant_passage(tiny_beir):
    data = load_beir(tiny_beir)
    qids = data.judged_queries()
    data.queries = {q: t + " cat paris weather" for q, t in data.queries.items()}  # hits beyond the positives
    mined = mine_negatives(data, qids, data.qrels, "bm25", depth=20, per_query=5)
    for q in qids:
        relevant = {data.doc_index[d] for d, g in data.qrels[q].items() if g > 0}
        assert not relevant & set(mined[q]) and len(mined[q]) <= 5
    assert all(len(v) == 5 for v in mined.values())
    # dense: embeddings that put every doc at the query's position except the relevant ones
    doc_emb = torch.randn(len(data.doc_ids), 8)
    q_emb = doc_emb[[data.doc_index[f"{q[2:]}-0"] for q in qids]]
    dense = mine_negatives(data, qids, data.qrels, "dense", depth=10, per_query=4, q_emb=q_emb, doc_emb=doc_emb)
    for row, q in enumerate(qids):
        order = dense_rankings(q_emb[row:row + 1], doc_emb, len(data.doc_ids))[0]
        relevant = {data.doc_index[d] for d, g in data.qrels[q].items() if g > 0}
        assert dense[q] == [i for i in order if i not in relevant][:4]
    both = mine_negatives(data, qids, data.qrels, "bm25+dense", depth=10, skip_top=1, per_query=4,
                          q_emb=q_emb, doc_emb=doc_emb)
    assert all(not set(both[q]) & {data.doc_index[d] for d, g in data.qrels[q].items() if g > 0} for q in qids)
    with pytest.raises(ValueError, match="negatives.method"):
        mine_negatives(data, qids, data.qrels, "colbert")
    with pytest.raises(ValueError, match="embeddings"):
        mine_negatives(data, qids, data.qrels, "dense")


def test_cache_is_keyed_by_what_produced_the_lists(tiny_beir, tmp_path):
    data = load_beir(tiny_beir)
    qids = data.judged_queries()
    settings = {"method": "bm25", "depth": 10, "skip_top": 0, "per_query": 3}
    calls = []

    def compute():
        calls.append(1)
        return mine_negatives(data, qids, data.qrels, "bm25", 10, 0, 3)

    key = mining_key(data, qids, data.qrels, settings, None)
    first, path, reused = cached_negatives(tmp_path, key, compute)
    again, path2, reused2 = cached_negatives(tmp_path, key, compute)
    assert (reused, reused2, len(calls), path2) == (False, True, 1, path) and again == first
    assert json.loads(path.read_text())["key"] == key
    other = mining_key(data, qids, {q: {} for q in qids}, settings, None)  # other labels -> other file
    assert cached_negatives(tmp_path, other, compute)[1] != path and len(calls) == 2
    deeper = mining_key(data, qids, data.qrels, {**settings, "skip_top": 2}, None)
    assert deeper != key


def test_sampler_draws_negatives_from_the_mined_lists(tiny_beir):
    data = load_beir(tiny_beir)
    data.qrels = {q: {d: g for d, g in grades.items() if g > 0} for q, grades in data.qrels.items()}
    mined = {q: [data.doc_index[f"filler-{i}"] for i in range(5, 11)] for q in data.judged_queries()}
    groups = GroupSampler(data, group_size=6, max_positives=3, seed=0, mined_negatives=mined).epoch_groups(0)
    for g in groups:
        assert set(g.doc_idx[3:]) <= set(mined[g.qid])


def test_training_mines_caches_and_remines(tiny_beir, tiny_encoder, tmp_path, capsys):
    cfg = retriever_cfg(tiny_beir, tmp_path, f"model.encoder={tiny_encoder}", "negatives.method=bm25+dense",
                        "negatives.per_query=4", "train.epochs=1")
    summary = train_and_evaluate(cfg, tmp_path / "a", progress=False, save_model=False)
    info = summary["negatives"]
    assert info["method"] == "bm25+dense" and not info["reused_cache"] and info["mean_per_query"] == 4
    assert str(tmp_path / "mined_negatives") in info["file"]
    assert "mined negatives (bm25+dense)" in capsys.readouterr().err
    assert train_and_evaluate(cfg, tmp_path / "b", progress=False, save_model=False)["negatives"]["reused_cache"]
    # re-mining: the callback runs at every epoch after the first, with the model being trained
    cfg = retriever_cfg(tiny_beir, tmp_path, f"model.encoder={tiny_encoder}", "train.epochs=3")
    data = load_beir(tiny_beir)
    seen = []

    def remine(model):
        seen.append(model.training)
        return {q: [data.doc_index["filler-3"]] for q in data.judged_queries()}

    trainer = RetrieverTrainer(cfg, data, tmp_path / "c", progress=False, remine=remine)
    trainer.fit()
    assert len(seen) == 2 and trainer.sampler.mined[data.judged_queries()[0]] == [data.doc_index["filler-3"]]
    bad = retriever_cfg(tiny_beir, tmp_path, f"model.encoder={tiny_encoder}", "negatives.method=bm25",
                        "negatives.remine_every_epoch=true")
    with pytest.raises(ValueError, match="dense"):
        train_and_evaluate(bad, tmp_path / "d", progress=False, save_model=False)
