"""Nothing dropped silently (docs/retrievers.md): qrels headers, loader summaries, empty inputs,
all-grade-0 queries, float grades, trec_eval's relevance level, loss-name normalisation, threads."""
from __future__ import annotations

import json
import math

import pytest
import torch

from gsdistill.losses import get_loss, loss_kind
from gsdistill.retriever.beir import load_beir, read_qrels
from gsdistill.retriever.cli import main
from gsdistill.retriever.evaluate import score_run
from gsdistill.retriever.groups import GroupSampler
from gsdistill.retriever.objective import loss_from_embeddings, step_inputs
from retriever_fixtures import tiny_beir, tiny_encoder, write_beir  # noqa: F401  (fixtures)


def test_header_is_recognised_by_its_names_not_by_a_failed_parse(tmp_path):
    p = tmp_path / "q.tsv"
    p.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert read_qrels(p) == {"q1": {"d1": 1}}
    p.write_text("qid iter docno rel\nq1 0 d1 2\n")  # TREC 4-column header
    assert read_qrels(p) == {"q1": {"d1": 2}}
    p.write_text("q1\td1\tyes\nq1\td2\t1\n")  # a malformed first judgement is not a header
    with pytest.raises(ValueError, match=r"q.tsv:1: relevance grade 'yes'"):
        read_qrels(p)
    p.write_text("q1\td1\tnan\n")
    with pytest.raises(ValueError, match="not finite"):
        read_qrels(p)


def test_float_grades_are_kept_and_any_grade_above_zero_is_relevant(tiny_beir):
    qrels = tiny_beir / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text() + "q-cat\tfiller-1\t0.5\n")
    data = load_beir(tiny_beir)
    assert data.qrels["q-cat"]["filler-1"] == 0.5 and data.qrels["q-cat"]["cat-0"] == 2
    assert isinstance(data.qrels["q-cat"]["cat-0"], int)
    sampler = GroupSampler(data, group_size=6, max_positives=5, seed=0)
    group = next(g for g in sampler.epoch_groups(0) if g.qid == "q-cat")
    assert data.doc_index["filler-1"] in group.doc_idx[:4] and 0.5 in group.grades


def test_all_grade_zero_queries_and_unknown_ids_are_counted_and_printed(tiny_beir, tiny_encoder, tmp_path, capsys):
    qrels = tiny_beir / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text() + "q-extra\tfiller-1\t0\nq-missing\tcat-0\t1\nq-cat\tno-such-doc\t1\n")
    with open(tiny_beir / "queries.jsonl", "a") as f:
        f.write(json.dumps({"_id": "q-extra", "text": "weather"}) + "\n")
    summary = load_beir(tiny_beir).summary()
    assert summary["queries_without_relevant"] == 1 and summary["queries_without_relevant_examples"] == ["q-extra"]
    assert summary["skipped"] == {"qrels query not in queries.jsonl": 1, "qrels doc not in corpus.jsonl": 1}
    common = [f"data.path={tiny_beir}", f"model.encoder={tiny_encoder}", "eval.k=10", "model.passage_max_length=32",
              "train.batch_size=2", "train.epochs=1", f"run.dir={tmp_path}"]
    assert main(["train", *common, "run.name=r", "data.folds=3"]) == 0
    err = capsys.readouterr().err
    assert "data [train]" in err and "data [eval]" in err and "data [loaded]" in err
    assert "1 queries with only grade-0" in err
    assert "qrels doc not in corpus.jsonl" in err
    written = json.loads((tmp_path / "r" / "data_summary.json").read_text())
    assert written["loaded"]["skipped"]["qrels doc not in corpus.jsonl"] == 1
    assert written["loaded"]["queries_without_relevant"] == 1 and written["train"]["judged_queries"] == 4
    assert main(["eval", *common, "--out", str(tmp_path / "z")]) == 0
    assert "data [eval]" in capsys.readouterr().err and (tmp_path / "z" / "data_summary.json").is_file()


def test_empty_corpus_or_empty_qrels_is_an_error(tmp_path, capsys):
    empty_corpus = write_beir(tmp_path / "a")
    (empty_corpus / "corpus.jsonl").write_text("")
    assert main(["eval", f"data.path={empty_corpus}", f"run.dir={tmp_path}"]) == 2
    assert "corpus is empty" in capsys.readouterr().err
    empty_qrels = write_beir(tmp_path / "b")
    (empty_qrels / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    assert main(["eval", f"data.path={empty_qrels}", f"run.dir={tmp_path}"]) == 2
    assert "no relevance judgements" in capsys.readouterr().err


def test_min_relevance_is_trec_eval_relevance_level():
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels = {"q1": {"a": 1, "b": 2, "c": 0, "d": 2}, "q2": {"e": 1, "f": 2}}
    run = {"q1": {"a": 4.0, "c": 3.0, "b": 2.0, "d": 1.0}, "q2": {"e": 2.0, "f": 1.0}}
    means, _, _ = score_run(run, qrels, ["MRR@10", "R@2", "nDCG@10"], min_relevance=2)
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "recall.2", "ndcg_cut.10"},
                                         relevance_level=2).evaluate(run)
    mean = lambda key: sum(v[key] for v in ref.values()) / len(ref)  # noqa: E731
    assert means["MRR@10"] == pytest.approx(mean("recip_rank")) == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert means["R@2"] == pytest.approx(mean("recall_2"))
    assert means["nDCG@10"] == pytest.approx(mean("ndcg_cut_10"))  # graded gains, unaffected by the level
    assert score_run(run, qrels, ["MRR@10"], min_relevance=1)[0]["MRR@10"] == 1.0


@pytest.mark.parametrize("error,code", [("TrainingDiverged", 1), ("TrainingInterrupted", 130)])
def test_train_reports_a_diverged_or_interrupted_run_like_pretrain(monkeypatch, tmp_path, capsys, error, code):
    from gsdistill.pretrain import loop
    from gsdistill.retriever import pipeline

    def stop(cfg, **_):
        raise getattr(loop, error)("step 3: stopped")
    monkeypatch.setattr(pipeline, "train_and_evaluate", stop)
    assert main(["train", f"run.dir={tmp_path}", "threads=1"]) == code
    assert "gsdistill retriever train: step 3: stopped" in capsys.readouterr().err


def test_score_run_keeps_fractional_grades():
    qrels = {"q": {"a": 0.5, "b": 1.5, "c": 0}}
    run = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}
    means, counts, _ = score_run(run, qrels, ["MRR@10", "Acc@1", "nDCG@10"], min_relevance=1)
    ideal = 1.5 + 0.5 / math.log2(3)
    assert means["nDCG@10"] == pytest.approx((0.5 + 1.5 / math.log2(3)) / ideal, abs=1e-4)  # 0.5 keeps its gain
    assert means["MRR@10"] == 0.5 and means["Acc@1"] == 0.0  # 0.5 < 1: not relevant; 1.5 relevant
    assert counts["queries_scored"] == 1


def test_loss_name_is_normalised_once_for_registry_and_kind(tiny_beir):
    data = load_beir(tiny_beir)
    assert loss_kind("Wasserstein") == loss_kind("wasserstein") == "graded"
    assert loss_kind("approx-ndcg") == "graded" and loss_kind("Sum-Marg-LH") == "multi_positive"
    groups = GroupSampler(data, group_size=4, max_positives=2, seed=0).epoch_groups(0)[:3]
    inputs = step_inputs(groups, data)
    g = torch.Generator().manual_seed(0)
    q, p = torch.randn(3, 8, generator=g), torch.randn(12, 8, generator=g)
    scale = lambda x: x / 0.1  # noqa: E731

    def value(name):
        return loss_from_embeddings(get_loss(name), name, q, p, scale, inputs, data, data.qrels, cross_device=False)

    assert value("Wasserstein").item() == pytest.approx(value("wasserstein").item())
    assert value("approx-ndcg").item() == pytest.approx(value("approx_ndcg").item())


def test_threads_setting_reaches_torch(tiny_beir, tiny_encoder, tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(["eval", f"data.path={tiny_beir}", f"model.encoder={tiny_encoder}", "eval.k=5",
                     "threads=1", f"run.dir={tmp_path}"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
