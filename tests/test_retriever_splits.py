"""Train on one split, select on dev, report on test, from one BEIR folder (a tiny NFCorpus slice):
the splits' queries reach the right stage, leaks are errors, the dev-best epoch is the model kept,
and the saved folder reproduces its test nDCG@10 through sentence-transformers' own encode."""
from __future__ import annotations

import json
import random

import pytest

from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.evaluate import evaluate_retriever
from gsdistill.retriever.loading import limit_queries
from gsdistill.retriever.model import DualEncoder
from gsdistill.retriever.pipeline import load_dev, load_split, train_and_evaluate
from retriever_fixtures import retriever_cfg, tiny_encoder  # noqa: F401  (fixtures)

SPLITS = {"train": 6, "dev": 3, "test": 3}  # judged queries kept per split


def _rows(path):
    lines = path.read_text().splitlines()
    return lines[0], [line.split("\t") for line in lines[1:]]


@pytest.fixture()
def nfcorpus_slice(shared_data, tmp_path):
    """The first judged queries of each NFCorpus split with at most 12 positives, their judged docs
    and 40 other docs, as a BEIR folder with qrels/{train,dev,test}.tsv and the graded train file."""
    src = shared_data / "beir_nfcorpus"
    if not src.is_dir():
        pytest.skip(f"{src} not found")
    out = tmp_path / "nfcorpus"
    (out / "qrels").mkdir(parents=True)
    (out / "extras").mkdir()
    keep_q, keep_d = set(), set()
    files = {s: src / "qrels" / f"{s}.tsv" for s in SPLITS} | {"graded": src / "extras" / "train_graded_orig.tsv"}
    kept, graded_2 = {}, {r[0] for r in _rows(files["graded"])[1] if r[2] == "2"}
    for split, n in SPLITS.items():
        header, rows = _rows(files[split])
        per_q: dict[str, list] = {}
        for r in rows:
            per_q.setdefault(r[0], []).append(r)
        order = sorted(per_q, key=lambda q: (q not in graded_2, q))  # train: some queries with grade-2 docs
        qids = [q for q in order if len(per_q[q]) <= 12][:n]
        keep_q.update(qids)
        kept[split] = (header, [r for q in qids for r in per_q[q]])
        keep_d.update(r[1] for q in qids for r in per_q[q])
    header, rows = _rows(files["graded"])
    kept["graded"] = (header, [r for r in rows if r[0] in keep_q])
    for split, (header, rows) in kept.items():
        path = out / ("extras/train_graded_orig.tsv" if split == "graded" else f"qrels/{split}.tsv")
        path.write_text("\n".join([header] + ["\t".join(r) for r in rows]) + "\n")
    docs = [json.loads(line) for line in (src / "corpus.jsonl").read_text().splitlines()]
    others = [d for d in docs if d["_id"] not in keep_d]
    chosen = [d for d in docs if d["_id"] in keep_d] + random.Random(0).sample(others, 40)
    (out / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in chosen) + "\n")
    queries = [json.loads(line) for line in (src / "queries.jsonl").read_text().splitlines()]
    (out / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries if q["_id"] in keep_q) + "\n")
    return out


def split_cfg(folder, tmp_path, encoder, *overrides):
    return retriever_cfg(folder, tmp_path, f"model.encoder={encoder}", "data.split=extras/train_graded_orig.tsv",
                         "data.dev_split=dev", "data.eval_split=test", "train.batch_size=2", "groups.size=4",
                         "groups.max_positives=2", *overrides)


def test_each_split_reaches_its_stage(nfcorpus_slice, tiny_encoder, tmp_path):
    cfg = split_cfg(nfcorpus_slice, tmp_path, tiny_encoder)
    _, train, test = load_split(cfg)
    dev = load_dev(cfg, train, test)
    judged = {s: {r[0] for r in _rows(nfcorpus_slice / "qrels" / f"{s}.tsv")[1]} for s in SPLITS}
    assert set(train.judged_queries()) == judged["train"] and set(dev.judged_queries()) == judged["dev"]
    assert set(test.judged_queries()) == judged["test"]
    assert 2 in {g for docs in train.qrels.values() for g in docs.values()}  # the .tsv path keeps grade 2
    assert {g for docs in load_beir(nfcorpus_slice, "train").qrels.values() for g in docs.values()} == {1}
    drawn = limit_queries(train, 4, seed=3)
    assert len(drawn.judged_queries()) == 4 and drawn.judged_queries() == limit_queries(train, 4, 3).judged_queries()


@pytest.mark.parametrize("overrides, message", [
    (["data.eval_split=train", "data.split=train"], "share"),
    (["data.dev_split=test"], "share"),
    (["data.folds=2"], "data.folds"),
])
def test_leaks_and_mixed_splitting_are_errors(nfcorpus_slice, tiny_encoder, tmp_path, overrides, message):
    cfg = split_cfg(nfcorpus_slice, tmp_path, tiny_encoder, *overrides)
    with pytest.raises(ValueError, match=message):
        train_and_evaluate(cfg, tmp_path / "run", progress=False, save_model=False)


def test_dev_best_epoch_is_kept_and_test_is_reported_once(nfcorpus_slice, tiny_encoder, tmp_path):
    cfg = split_cfg(nfcorpus_slice, tmp_path, tiny_encoder, "train.epochs=3", "train.lr=3e-4")
    summary = train_and_evaluate(cfg, tmp_path / "run", progress=False, save_model=True)
    sel = summary["selection"]
    assert len(sel["dev_scores"]) == 3 and sel["split_queries"] == SPLITS["dev"]
    assert sel["best_epoch"] == sel["dev_scores"].index(max(sel["dev_scores"]))
    model = DualEncoder.from_pretrained(summary["model_dir"])
    _, train, test = load_split(cfg)
    dev = load_dev(cfg, train, test)
    again = evaluate_retriever(model, dev, k=cfg.eval.k, measures=["nDCG@10"], progress=False)
    assert again["metrics"]["nDCG@10"] == pytest.approx(max(sel["dev_scores"]), abs=1e-6)  # the kept weights
    per_query = json.loads((tmp_path / "run" / "eval" / "per_query.json").read_text())
    assert set(per_query) == set(test.judged_queries())  # reported on test queries only
    summaries = json.loads((tmp_path / "run" / "data_summary.json").read_text())
    assert summaries["train"]["judged_queries"] == SPLITS["train"] and summaries["dev"]["judged_queries"] == 3


def test_saved_separate_towers_reproduce_test_ndcg_through_sentence_transformers(nfcorpus_slice, tiny_encoder,
                                                                                 tmp_path):
    pytest.importorskip("sentence_transformers")
    from gsdistill.retriever.st_check import sentence_transformers_metrics

    cfg = split_cfg(nfcorpus_slice, tmp_path, tiny_encoder, "model.shared=false", "model.freeze_passage=true",
                    "train.lr=3e-4", "eval.measures=[nDCG@10,R@100]")
    summary = train_and_evaluate(cfg, tmp_path / "run", progress=False, save_model=True)
    test = load_split(cfg)[2]
    theirs = sentence_transformers_metrics(summary["model_dir"], test, ["nDCG@10", "R@100"], k=cfg.eval.k)
    ours = summary["eval"]["metrics"]
    assert theirs["nDCG@10"] == pytest.approx(ours["nDCG@10"], abs=1e-6)
    assert theirs["R@100"] == pytest.approx(ours["R@100"], abs=1e-6)


def test_cli_eval_scores_the_eval_split(nfcorpus_slice, tiny_encoder, tmp_path):
    from gsdistill.retriever.cli import main

    out = tmp_path / "zero-shot"
    assert main(["eval", "--out", str(out), f"data.path={nfcorpus_slice}", f"model.encoder={tiny_encoder}",
                 "data.split=train", "data.eval_split=test", "eval.k=20"]) == 0
    assert json.loads((out / "metrics.json").read_text())["counts"]["queries_scored"] == SPLITS["test"]
