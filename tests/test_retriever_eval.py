"""Retriever evaluation end to end: run file vs pytrec_eval, CLI train/eval, real BEIR dbpedia."""
from __future__ import annotations

import json

import pytest

from gsdistill.eval import metrics
from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.cli import main
from gsdistill.retriever.evaluate import evaluate_retriever, read_trec_run
from gsdistill.retriever.model import DualEncoder
from retriever_fixtures import tiny_beir, tiny_encoder  # noqa: F401  (fixtures)


def test_evaluate_writes_a_run_file_that_pytrec_eval_scores_the_same(tiny_beir, tiny_encoder, tmp_path):
    import pytrec_eval

    data = load_beir(tiny_beir)
    model = DualEncoder(tiny_encoder)
    res = evaluate_retriever(model, data, k=10, measures=["MRR", "R@5", "nDCG@10"], out_dir=tmp_path, progress=False)
    run = read_trec_run(tmp_path / "run.trec")
    assert len(run) == 6 and all(len(v) == 10 for v in run.values())
    ranks = [line.split()[3] for line in (tmp_path / "run.trec").read_text().splitlines()[:10]]
    assert ranks == [str(i) for i in range(1, 11)]
    ref = pytrec_eval.RelevanceEvaluator(data.qrels, {"recip_rank", "recall.5", "ndcg_cut.10"}).evaluate(run)
    mean = lambda key: sum(v[key] for v in ref.values()) / len(ref)  # noqa: E731
    assert res["metrics"]["MRR"] == pytest.approx(mean("recip_rank"))
    assert res["metrics"]["R@5"] == pytest.approx(mean("recall_5"))
    assert res["metrics"]["nDCG@10"] == pytest.approx(mean("ndcg_cut_10"))
    assert json.loads((tmp_path / "metrics.json").read_text())["counts"]["queries_scored"] == 6


def test_cli_train_then_eval(tiny_beir, tiny_encoder, tmp_path, capsys):
    common = [f"data.path={tiny_beir}", f"model.encoder={tiny_encoder}", "data.folds=3", "eval.k=10",
              "model.passage_max_length=32", "train.batch_size=2"]
    assert main(["train", *common, f"run.dir={tmp_path}", "run.name=r", "loss.name=lse_pair"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["train_queries"] == 4 and summary["eval"]["counts"]["queries_scored"] == 2
    assert (tmp_path / "r" / "eval" / "run.trec").is_file()
    assert main(["eval", "--model", str(tmp_path / "r" / "model"), "--out", str(tmp_path / "e"), *common]) == 0
    again = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert again["metrics"] == pytest.approx(summary["eval"]["metrics"])  # saved model reproduces its numbers
    assert main(["train", *common, "loss.name=lse_pairs"]) == 2
    assert "did you mean 'lse_pair'" in capsys.readouterr().err
    assert main(["train", f"data.path={tmp_path / 'missing'}"]) == 2


@pytest.mark.slow
def test_zero_shot_minilm_on_dbpedia_subset(shared_data, tmp_path):
    data = load_beir(shared_data / "beir_dbpedia_subset")
    assert data.summary()["judged_queries"] == 40 and data.summary()["skipped"] == {}
    res = evaluate_retriever(DualEncoder(), data, k=100, measures=["nDCG@10", "R@100"], out_dir=tmp_path,
                             progress=False)
    assert 0.3 < res["metrics"]["nDCG@10"] < 0.9  # a real, non-trivial ranking
    per_query = json.loads((tmp_path / "per_query.json").read_text())
    assert len(per_query) == 40
    assert metrics.evaluate(read_trec_run(tmp_path / "run.trec"), data.qrels, ["nDCG@10"])["nDCG@10"] == \
        pytest.approx(res["metrics"]["nDCG@10"], abs=1e-6)
