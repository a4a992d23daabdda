"""Issue 55 for the text retrievers: nothing a user owns is deleted, overwritten or mixed without
their word. A trained run folder is not trained into again (``--overwrite`` removes only what a run
wrote), a folder being written is refused to a second writer, a resume that would change what its
steps are (or read other data) is refused before it writes a byte, every start and resume is in
``history.jsonl``, two different records under one id are an error in every reader, a blank query is
counted and never scored, and an output path that is a file is one line with exit code 2."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch.distributed as dist

from gsdistill import cli, run_history
from gsdistill.errors import GsdistillError
from gsdistill.output_folder import LOCK_NAME, FolderBusy
from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.dpr import load_dpr
from gsdistill.retriever.evaluate import read_trec_run
from gsdistill.retriever.tevatron import load_tevatron
from retriever_fixtures import tiny_beir, tiny_encoder, write_beir  # noqa: F401  (fixtures)


def _train(tmp_path, beir, encoder, *extra) -> int:
    return cli.main(["retriever", "train", f"data.path={beir}", f"model.encoder={encoder}",
                     f"run.dir={tmp_path / 'runs'}", "run.name=r", "model.query_max_length=16",
                     "model.passage_max_length=32", "train.batch_size=1", "train.epochs=1", "eval.k=20",
                     "data.folds=2", "threads=1", "train.device=cpu", *extra])


def _bytes(folder: Path, *names: str) -> dict:
    return {n: (folder / n).read_bytes() for n in names}


def test_a_trained_run_folder_is_refused_and_overwrite_removes_only_what_a_run_writes(tiny_beir, tiny_encoder,
                                                                                       tmp_path):
    run = tmp_path / "runs" / "r"
    assert _train(tmp_path, tiny_beir, tiny_encoder) == 0
    (run / "notes.txt").write_text("mine")
    kept = _bytes(run, "model/model.safetensors", "metrics.csv", "config.yaml", "history.jsonl")
    assert _train(tmp_path, tiny_beir, tiny_encoder, "train.seed=3") == 2
    assert _bytes(run, *kept) == kept  # the saved model, the metrics, the config: untouched
    assert _train(tmp_path, tiny_beir, tiny_encoder, "--overwrite", "train.seed=3") == 0
    assert (run / "notes.txt").read_text() == "mine"
    assert (run / "model/model.safetensors").read_bytes() != kept["model/model.safetensors"]
    assert [row["event"] for row in run_history.read(run)] == ["start", "stop"]  # the old run's history went with it
    assert not (run / LOCK_NAME).exists()


def test_a_second_writer_is_refused_with_the_holders_pid(tiny_beir, tiny_encoder, tmp_path, capsys):
    run, out = tmp_path / "runs" / "r", tmp_path / "eval_out"
    hold = ("import sys, time\nfrom gsdistill.output_folder import lock_folder\n"
            "with lock_folder(sys.argv[1]), lock_folder(sys.argv[2]):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run), str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert _train(tmp_path, tiny_beir, tiny_encoder) == 2
        assert cli.main(["retriever", "eval", f"data.path={tiny_beir}", f"model.encoder={tiny_encoder}",
                         "eval.k=5", "threads=1", "--out", str(out)]) == 2
        assert capsys.readouterr().err.count(f"PID {holder.pid}") == 2
        assert [p.name for p in run.iterdir()] == [p.name for p in out.iterdir()] == [LOCK_NAME]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    assert _train(tmp_path, tiny_beir, tiny_encoder) == 0  # the dead holder's lock is taken over


class _Rank1:
    """This process plays rank 1 of 2; ``broadcast_object_list`` hands over what rank 0 sent."""

    def __init__(self, monkeypatch, sent):
        self.sent = list(sent)
        monkeypatch.setattr(dist, "is_available", lambda: True)
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(dist, "broadcast_object_list", self.broadcast)

    def broadcast(self, box, src=0, group=None, device=None):
        box[0] = self.sent.pop(0)


def test_only_rank0_locks_and_every_rank_raises_its_refusal(tiny_beir, tmp_path, monkeypatch):
    from gsdistill.retriever.run_folder import claim_run_folder
    from retriever_fixtures import retriever_cfg

    cfg = retriever_cfg(tiny_beir, tmp_path)
    run = tmp_path / "test"
    _Rank1(monkeypatch, [None, (FolderBusy, f"{run}: in use by PID 1")])
    with claim_run_folder(cfg, run, False, None):
        assert not run.exists()  # rank 1 neither creates, locks nor cleans the folder
    with pytest.raises(FolderBusy):
        with claim_run_folder(cfg, run, False, None):
            pass


def test_a_resume_that_changes_its_steps_is_refused_before_it_writes(tiny_beir, tiny_encoder, tmp_path, capsys):
    run = tmp_path / "runs" / "r"
    assert _train(tmp_path, tiny_beir, tiny_encoder, "train.stop_after=1") == 0
    kept = _bytes(run, "config.yaml", "metrics.csv", "history.jsonl", "model/model.safetensors")
    resume = [f"train.resume={run}", "threads=1"]  # the run's own config: nothing else to repeat
    for change in ("train.batch_size=2", "train.seed=1", "loss.name=single_lh", "groups.size=4", "data.fold=1"):
        assert cli.main(["retriever", "train", *resume, change]) == 2, change
        assert _bytes(run, *kept) == kept, change
    assert cli.main(["retriever", "train", *resume, "--overwrite"]) == 2  # continue or start afresh, not both
    capsys.readouterr()
    assert cli.main(["retriever", "train", *resume, "train.epochs=2", "train.stop_after=2"]) == 0  # extending: allowed
    assert "train.epochs: 1 -> 2" in capsys.readouterr().err  # every resume prints its changes
    assert cli.main(["retriever", "train", *resume, "train.batch_size=2", "train.resume_changes=allow"]) == 0
    rows = [r for r in run_history.read(run) if r["event"] != "stop"]
    assert [r["event"] for r in rows] == ["start", "resume", "resume"]
    assert rows[1]["step"] == 1 and rows[1]["changed"] == {"train.epochs": [1, 2]}
    assert rows[2]["step"] == 2 and rows[2]["changed"]["train.batch_size"] == [1, 2] and rows[2]["allowed"]
    assert rows[0]["data"]["digest"] == rows[2]["data"]["digest"]


def test_a_resume_reads_the_data_the_run_started_with(tiny_beir, tiny_encoder, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_beir.parent)
    run = tmp_path / "runs" / "r"
    assert _train(tmp_path, Path(tiny_beir.name), tiny_encoder, "train.stop_after=1") == 0  # relative data.path
    kept = _bytes(run, "config.yaml", "metrics.csv", "history.jsonl")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    resume = ["retriever", "train", f"train.resume={run}", "threads=1", "train.stop_after=2"]
    assert cli.main([*resume, f"data.path={tiny_beir.name}"]) == 2  # no ./beir here
    other = write_beir(elsewhere / tiny_beir.name)  # a ./beir with other judgements
    (other / "qrels" / "test.tsv").write_text((other / "qrels" / "test.tsv").read_text().replace("\t2\n", "\t1\n"))
    assert cli.main([*resume, f"data.path={tiny_beir.name}"]) == 2
    assert _bytes(run, *kept) == kept
    assert cli.main(resume) == 0  # the run's own config names its data absolutely: read from here too
    starts = [r["data"] for r in run_history.read(run) if r["event"] in ("start", "resume")]
    assert [d["paths"]["data.path"] for d in starts] == [str(tiny_beir.resolve())] * 2
    assert starts[0]["digest"] == starts[1]["digest"]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _beir_case(tmp_path, part, twice):
    """A BEIR folder whose corpus, queries or qrels repeat their second record ("same"), repeat its id
    with other contents ("different"), or do not repeat it ("none")."""
    folder = write_beir(tmp_path / "beir")
    name = {"corpus": "corpus.jsonl", "queries": "queries.jsonl", "qrels": "qrels/test.tsv"}[part]
    text = (folder / name).read_text()
    again = text.splitlines()[1]
    if twice == "different":
        again = again.replace('"text": "', '"text": "not ') if part != "qrels" else again.rsplit("\t", 1)[0] + "\t0"
    (folder / name).write_text(text + (again + "\n" if twice != "none" else ""))
    return load_beir(folder)


def _tevatron_case(tmp_path, part, twice):
    tmp_path.mkdir(parents=True)
    q = {"query_id": "q1", "query": "cats", "positive_passages": [{"docid": "d1", "text": "cats purr"}],
         "negative_passages": [{"docid": "d2", "text": "dogs bark"}]}
    if part == "queries":
        again = [{**q, "query": "dogs"}] if twice == "different" else [q] if twice == "same" else []
        return load_tevatron(_jsonl(tmp_path / "t.jsonl", [q, *again]))
    ids = {"query_id": "q1", "query_text": "cats", "positive_document_ids": ["d1"], "negative_document_ids": ["d2"]}
    corpus = [{"docid": "d1", "text": "cats purr"}, {"docid": "d2", "text": "dogs bark"}]
    again = [{"docid": "d1", "text": "cats sleep" if twice == "different" else "cats purr"}] if twice != "none" else []
    return load_tevatron(_jsonl(tmp_path / "t.jsonl", [ids]), _jsonl(tmp_path / "c.jsonl", corpus + again))


def _dpr_case(tmp_path, part, twice):
    tmp_path.mkdir(parents=True)
    item = {"id": "q1", "question": "cats", "positive_ctxs": [{"passage_id": "d1", "text": "cats purr"}],
            "hard_negative_ctxs": [{"passage_id": "d2", "text": "dogs bark"}]}
    again = [{**item, "question": "dogs"}] if twice == "different" else [item] if twice == "same" else []
    (tmp_path / "d.json").write_text(json.dumps([item, *again]))
    return load_dpr(tmp_path / "d.json")


CASES = [(_beir_case, "corpus"), (_beir_case, "queries"), (_beir_case, "qrels"), (_tevatron_case, "queries"),
         (_tevatron_case, "corpus"), (_dpr_case, "queries")]


@pytest.mark.parametrize("case,part", CASES, ids=[f"{c.__name__[1:-5]}-{p}" for c, p in CASES])
def test_two_records_under_one_id_are_refused_and_an_exact_repeat_is_kept_once(tmp_path, case, part):
    with pytest.raises(GsdistillError):
        case(tmp_path / "different", part, "different")
    same, plain = case(tmp_path / "same", part, "same"), case(tmp_path / "none", part, "none")
    assert (same.doc_ids, same.doc_texts, same.queries, same.qrels, same.negatives) == \
           (plain.doc_ids, plain.doc_texts, plain.queries, plain.qrels, plain.negatives)
    assert sum(same.skipped.values()) == sum(plain.skipped.values()) + 1  # the repeat is counted


@pytest.mark.parametrize("fmt", ["tevatron", "dpr"])
def test_an_inline_passage_id_with_two_texts_is_refused(tmp_path, fmt):
    def load(second_text: str):
        first = {"docid": "d1", "passage_id": "d1", "text": "cats purr"}
        shared = {**first, "text": second_text}  # the same passage id, cited by a second query
        if fmt == "tevatron":
            return load_tevatron(_jsonl(tmp_path / "t.jsonl", [
                {"query_id": "q1", "query": "cats", "positive_passages": [first]},
                {"query_id": "q2", "query": "purring", "positive_passages": [shared]}]))
        (tmp_path / "d.json").write_text(json.dumps([{"id": "q1", "question": "cats", "positive_ctxs": [first]},
                                                     {"id": "q2", "question": "purring", "positive_ctxs": [shared]}]))
        return load_dpr(tmp_path / "d.json")

    with pytest.raises(GsdistillError):
        load("cats sleep")
    data = load("cats purr")  # one passage cited twice: one document, nothing skipped
    assert data.doc_texts == ["cats purr"] and sorted(data.qrels) == ["q1", "q2"] and not data.skipped


def test_a_trec_run_with_two_scores_for_one_pair_is_refused(tmp_path):
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 0.9 t\nq1 Q0 d2 2 0.5 t\nq1 Q0 d1 1 0.9 t\n")
    skipped = Counter()
    assert read_trec_run(run, skipped) == {"q1": {"d1": 0.9, "d2": 0.5}} and sum(skipped.values()) == 1
    run.write_text("q1 Q0 d1 1 0.9 t\nq1 Q0 d1 2 0.4 t\n")
    with pytest.raises(GsdistillError):
        read_trec_run(run)


def test_a_blank_query_is_counted_and_never_scored(tiny_beir, tiny_encoder, tmp_path):
    queries = tiny_beir / "queries.jsonl"
    queries.write_text(queries.read_text().replace('"capital city of France"', '"   "'))
    data = load_beir(tiny_beir)
    assert "q-paris" not in data.queries and "q-paris" not in data.judged_queries()
    assert sum(data.skipped.values()) == 2  # the query, and its judgements
    out = tmp_path / "out"
    assert cli.main(["retriever", "eval", f"data.path={tiny_beir}", f"model.encoder={tiny_encoder}", "eval.k=5",
                     "threads=1", "--out", str(out)]) == 0
    assert "q-paris" not in read_trec_run(out / "run.trec") and len(read_trec_run(out / "run.trec")) == 5
    assert sum(json.loads((out / "data_summary.json").read_text())["eval"]["skipped"].values()) == 2


def test_an_output_path_that_is_a_file_and_a_second_evaluation_are_one_line_exit_2(tiny_beir, tiny_encoder, tmp_path,
                                                                                  capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    common = [f"data.path={tiny_beir}", f"model.encoder={tiny_encoder}", "eval.k=5", "threads=1"]
    assert _train(tmp_path, tiny_beir, tiny_encoder, f"run.dir={a_file}") == 2
    assert cli.main(["retriever", "eval", *common, f"run.dir={a_file}"]) == 2
    assert cli.main(["retriever", "eval", *common, "--out", str(a_file)]) == 2
    assert cli.main(["retriever", "train", *common, f"run.dir={tmp_path}", f"negatives.cache_dir={a_file}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 4 and a_file.read_text() == "mine"
    out = tmp_path / "out"
    assert cli.main(["retriever", "eval", *common, "--out", str(out)]) == 0
    first = _bytes(out, "metrics.json", "run.trec")
    assert cli.main(["retriever", "eval", *common, "eval.k=3", "--out", str(out)]) == 2  # an earlier evaluation
    assert _bytes(out, *first) == first
    assert cli.main(["retriever", "eval", *common, "eval.k=3", "--overwrite", "--out", str(out)]) == 0
    assert _bytes(out, *first) != first
