"""Issue 33 rows 8 and 9 (retrieval): a UTF-8 byte-order mark in BEIR files is not part of the first
field; ``eval retrieval --model`` on a text-retriever folder says what it is; the held-out check
compares page contents, so a renamed copy of a pretraining document is caught."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gsdistill.config import load_config, save_config
from gsdistill.eval import cli as eval_cli
from gsdistill.eval import splits
from gsdistill.retriever.beir import load_beir, read_qrels
from gsdistill.retriever.dpr import load_dpr
from gsdistill.retriever.evaluate import read_trec_run
from gsdistill.tuples.store.writer import write_shards
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.sources.synthetic import generate_pages
from retriever_fixtures import write_beir

BOM = b"\xef\xbb\xbf"


def _prepend_bom(path: Path) -> None:
    path.write_bytes(BOM + path.read_bytes())


@pytest.mark.parametrize("header", [True, False])
def test_bom_in_every_beir_file_loses_no_line(tmp_path, header):
    folder = write_beir(tmp_path / "b", header=header)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        _prepend_bom(folder / name)
    data = load_beir(folder)
    assert data.skipped == {} and sum(len(g) for g in data.qrels.values()) == 24
    assert data.doc_ids[0] == "cat-0" and "q-cat" in data.queries


def test_bom_in_dpr_and_trec_files(tmp_path):
    dpr = tmp_path / "dpr.json"
    dpr.write_bytes(BOM + json.dumps([{"question": "q", "answers": [], "positive_ctxs": [{"title": "", "text": "p"}],
                                        "negative_ctxs": [], "hard_negative_ctxs": []}]).encode())
    assert list(load_dpr(dpr).queries.values()) == ["q"]
    run = tmp_path / "run.trec"
    run.write_bytes(BOM + b"q1 Q0 d1 1 0.5 tag\n")
    assert read_trec_run(run) == {"q1": {"d1": 0.5}}


def test_qrels_that_are_not_utf8_name_the_file(tmp_path):
    path = tmp_path / "qrels.tsv"
    path.write_bytes("q1\td1\t1\nq\xe9\td2\t1\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{path}: not UTF-8 text \(invalid continuation byte at byte \d+\)"):
        read_qrels(path)


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pages")
    write_shards(generate_pages(4, seed=0, width=256, height=256), out, progress=False)
    return out


def _run(folder: Path, shards: Path) -> Path:
    """A pretraining run folder as the held-out check reads it (its config names its pages)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"data": {"shards": str(shards)}, "model": {"backbone": {}}}))
    return folder


def test_retriever_folder_is_named_as_such(tmp_path, pages, capsys):
    run = tmp_path / "retriever_run"
    save_config(load_config("retriever", None, [f"data.path={tmp_path}"]), run)
    (run / "model").mkdir()
    (run / "model" / "dual_encoder.json").write_text("{}")
    for model in (run, run / "model"):
        code = eval_cli.main(["retrieval", "--model", str(model), "--pages", str(pages), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "did you mean" not in err
        assert f"--model {model}: a text-retriever folder" in err and "gsdistill retriever eval" in err


def test_renamed_copy_of_pretraining_pages_is_caught(tmp_path, pages, capsys):
    renamed = tmp_path / "renamed"
    copies = []
    for page in read_pages(pages):
        page.update(id="copy-" + page["id"], doc_id="copy-of-" + page["doc_id"])
        copies.append(page)
    write_shards(copies, renamed, progress=False)
    run = _run(tmp_path / "run", pages)
    code = eval_cli.main(["retrieval", "--model", str(run), "--pages", str(renamed), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "4 evaluation page(s) have the same image or text as pretraining pages under another document name" in err
    assert "copy-of-synthetic-0-doc000000/copy-synthetic-0-0000000 = synthetic-0-doc000000/synthetic-0-0000000" in err


def test_other_pages_pass_the_content_check(tmp_path, pages):
    other = tmp_path / "other"
    write_shards(generate_pages(4, seed=1, width=256, height=256), other, progress=False)
    splits.check_held_out_pages(splits.content_index(other), pages, "other vs pages")
    blank = {"id": "b", "image": b"same bytes", "spans": [], "boxes": []}
    assert splits.page_fingerprints(blank) == []  # blank pages of two documents are not "the same page"
