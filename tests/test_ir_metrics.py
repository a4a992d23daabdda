"""IR metrics and exact search against reference libraries (pytrec_eval, ir_measures, faiss)."""
from __future__ import annotations

import math
import random

import pytest
import torch

from gsdistill.eval import metrics
from gsdistill.eval.index import search

MEASURES = ["MRR@10", "MRR", "R@5", "R@20", "R@100", "R@1000", "nDCG@10", "nDCG", "Acc@1", "Acc@20", "Acc@100"]


def random_run_and_qrels(seed: int, n_queries: int = 25, n_docs: int = 300, ties: bool = False):
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(n_docs)]
    run, qrels = {}, {}
    for q in range(n_queries):
        qid = f"q{q}"
        judged = rng.sample(docs, rng.randint(3, 40))
        grades = {d: rng.choice([0, 0, 1, 2]) for d in judged}
        grades[judged[0]] = rng.choice([1, 2])  # at least one relevant doc
        qrels[qid] = grades
        retrieved = rng.sample(docs, rng.randint(5, 200))
        # coarse scores create ties, which trec_eval breaks by doc id
        run[qid] = {d: (round(rng.random(), 1) if ties else rng.random()) for d in retrieved}
    return run, qrels


def pytrec_reference(run, qrels) -> dict[str, float]:
    import pytrec_eval

    names = {"recip_rank", "recall_5", "recall_20", "recall_100", "recall_1000", "ndcg_cut_10", "ndcg",
             "success_1"}
    per_q = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "recall", "ndcg_cut", "ndcg", "success"}).evaluate(run)
    out = {n: sum(v[n] for v in per_q.values()) / len(qrels) for n in names}
    return {"MRR": out["recip_rank"], "R@5": out["recall_5"], "R@20": out["recall_20"],
            "R@100": out["recall_100"], "R@1000": out["recall_1000"], "nDCG@10": out["ndcg_cut_10"],
            "nDCG": out["ndcg"], "Acc@1": out["success_1"]}


def ir_measures_reference(run, qrels) -> dict[str, float]:
    import ir_measures
    from ir_measures import RR, R, nDCG, Success

    ours_to_ref = {"MRR@10": RR @ 10, "MRR": RR, "R@20": R @ 20, "R@100": R @ 100, "nDCG@10": nDCG @ 10,
                   "Acc@1": Success @ 1, "Acc@20": Success @ 20, "Acc@100": Success @ 100}
    agg = ir_measures.calc_aggregate(list(ours_to_ref.values()), qrels, run)
    return {ours: agg[ref] for ours, ref in ours_to_ref.items()}


@pytest.mark.parametrize("seed,ties", [(0, False), (1, True), (2, True)])
def test_metrics_equal_pytrec_eval(seed, ties):
    run, qrels = random_run_and_qrels(seed, ties=ties)
    ours = metrics.evaluate(run, qrels, MEASURES)
    for name, ref in pytrec_reference(run, qrels).items():
        assert ours[name] == pytest.approx(ref, abs=1e-9), name


@pytest.mark.parametrize("seed", [3, 4])
def test_metrics_equal_ir_measures(seed):
    # no ties: ir_measures picks a provider per measure, and some order tied docs differently
    # from trec_eval (the tie convention is checked against pytrec_eval above)
    run, qrels = random_run_and_qrels(seed, ties=False)
    ours = metrics.evaluate(run, qrels, MEASURES)
    for name, ref in ir_measures_reference(run, qrels).items():
        assert ours[name] == pytest.approx(ref, abs=1e-9), name


def test_hand_computed_query():
    run = {"q": {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.1}}
    qrels = {"q": {"b": 2, "d": 1, "x": 1, "a": 0}}
    m = metrics.evaluate(run, qrels, ["MRR@10", "MRR@1", "R@3", "Acc@1", "Acc@2", "nDCG@3"])
    assert m["MRR@10"] == 0.5 and m["MRR@1"] == 0.0 and m["Acc@1"] == 0.0 and m["Acc@2"] == 1.0
    assert m["R@3"] == pytest.approx(1 / 3)
    import math
    assert m["nDCG@3"] == pytest.approx((2 / math.log2(3)) / (2 + 1 / math.log2(3) + 1 / math.log2(4)))


def test_counts_and_missing_queries():
    run = {"q1": {"a": 1.0}}
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 0}}
    means, counts = metrics.evaluate_with_counts(run, qrels, ["Acc@1"])
    assert means["Acc@1"] == 0.5
    assert counts == {"queries_scored": 2, "queries_without_relevant": 1, "queries_missing_from_run": 1}


def test_unknown_measure_is_rejected():
    with pytest.raises(ValueError, match="unknown IR measure 'MAP@5'"):
        metrics.evaluate({}, {}, ["MAP@5"])
    with pytest.raises(ValueError, match="cutoff"):
        metrics.parse_measure("R@0")


def test_search_matches_brute_force_and_faiss():
    g = torch.Generator().manual_seed(0)
    q, d = torch.randn(7, 16, generator=g), torch.randn(2000, 16, generator=g)
    s_t, i_t = search(q, d, 50, use_faiss=False, doc_chunk=300, query_chunk=3)
    s_f, i_f = search(q, d, 50, use_faiss=True)
    ref = (q @ d.T).topk(50, dim=1)
    assert torch.equal(i_t, ref.indices) and torch.equal(i_t, i_f)
    assert torch.allclose(s_t, ref.values, atol=1e-5) and torch.allclose(s_f, s_t, atol=1e-5)


def test_search_ties_are_deterministic_and_k_is_clipped():
    q = torch.ones(2, 4)
    d = torch.ones(10, 4)  # every doc ties
    s, i = search(q, d, 20, use_faiss=False, doc_chunk=3)
    assert i.shape == (2, 10) and i[0].tolist() == list(range(10))
    assert torch.equal(search(q, d, 20, use_faiss=True)[1], i)
    with pytest.raises(ValueError, match=r"\[Q, D\]"):
        search(torch.ones(2, 3), d, 5)


def test_ties_follow_trec_eval_order_also_under_a_cutoff():
    # equal scores: trec_eval ranks doc ids descending, so "b" comes before "a"
    run = {"q": {"a": 0.5, "b": 0.5, "c": 0.4}}
    assert metrics.rank_documents(run["q"]) == ["b", "a", "c"]
    m = metrics.evaluate(run, {"q": {"a": 1}}, ["MRR@1", "MRR@2", "MRR", "Acc@1", "P@2", "R@1"])
    assert m == {"MRR@1": 0.0, "MRR@2": 0.5, "MRR": 0.5, "Acc@1": 0.0, "P@2": 0.5, "R@1": 0.0}
    means, counts = metrics.evaluate_with_counts({}, {"q": {"a": 1}, "n": {"x": 0}}, ["MRR", "nDCG@10"])
    assert means == {"MRR": 0.0, "nDCG@10": 0.0}
    assert counts == {"queries_scored": 1, "queries_without_relevant": 1, "queries_missing_from_run": 1}


def direct_ndcg(scores: dict[str, float], grades: dict[str, float], k: int) -> float:
    """trec_eval's nDCG@k written out: linear gain g_i, discount log2(i + 1) at rank i, run in trec_eval's
    order (score descending, ties by doc id descending), ideal DCG from the sorted grades."""
    ranked = sorted(sorted(scores, reverse=True), key=lambda d: -scores[d])[:k]
    dcg = sum(grades.get(d, 0.0) / math.log2(i + 1) for i, d in enumerate(ranked, 1))
    ideal = sum(g / math.log2(i + 1) for i, g in enumerate(sorted(grades.values(), reverse=True)[:k], 1))
    return dcg / ideal


def test_fractional_grades_keep_their_value_in_ndcg():
    rng = random.Random(0)
    run, qrels = {}, {}
    for q in range(20):
        docs = [f"d{i}" for i in range(30)]
        qrels[f"q{q}"] = {d: rng.choice([0, 0.125, 0.5, 1.0, 1.5, 2.75]) for d in rng.sample(docs, 12)}
        qrels[f"q{q}"]["d0"] = 1.5  # at least one doc of grade >= 1
        run[f"q{q}"] = {d: round(rng.random(), 2) for d in rng.sample(docs, 20)}
    per_query = metrics.evaluate_per_query(run, qrels, ["nDCG@10", "nDCG@5"])
    for q in qrels:
        assert per_query[q]["nDCG@10"] == pytest.approx(direct_ndcg(run[q], qrels[q], 10), abs=1e-4)
        assert per_query[q]["nDCG@5"] == pytest.approx(direct_ndcg(run[q], qrels[q], 5), abs=1e-4)
    # a 0.5 counts as half a 1 (not 0): only the grade-0.5 doc retrieved, the grade-1 doc missed
    got = metrics.evaluate({"q": {"half": 1.0}}, {"q": {"one": 1, "half": 0.5}}, ["nDCG@10"])["nDCG@10"]
    assert got == pytest.approx(0.5 / (1 + 0.5 / math.log2(3)), abs=1e-4)


def test_binary_measures_threshold_fractional_grades():
    qrels = {"q": {"a": 0.5, "b": 1.5, "c": 0, "d": 1.5}}
    run = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}
    m = metrics.evaluate(run, qrels, ["MRR", "Acc@1", "Acc@2", "P@2", "R@1", "R@3"], min_relevance=1)
    assert m == pytest.approx({"MRR": 0.5, "Acc@1": 0.0, "Acc@2": 1.0, "P@2": 0.5, "R@1": 0.0, "R@3": 0.5})
    assert metrics.evaluate(run, qrels, ["MRR", "R@3"], min_relevance=0.5) == pytest.approx({"MRR": 1.0, "R@3": 2 / 3})
    counts = metrics.evaluate_with_counts(run, qrels, ["MRR"], min_relevance=2)[1]
    assert counts["queries_scored"] == 0  # no doc of grade >= 2: the query is not scored
    assert metrics.grade_scale({"q": {"a": 0.5, "b": 1.25}}) == 100 and metrics.grade_scale(qrels) == 10
    assert metrics.grade_scale({"q": {"a": 0.1, "b": 0.3}}) == 10  # float noise: 0.3 * 10 != 3 exactly
    with pytest.raises(ValueError, match="more than 6 decimals"):
        metrics.evaluate(run, {"q": {"a": 1 / 3, "b": 1}}, ["nDCG@10"])
