"""Issue 63, item 2: an input is never an output, even with ``--overwrite`` (the experiment file, the
data, any file the command reads, inside or equal to the output folder, is refused before a byte is
written); "holds an earlier run" is said only of a folder that holds one; and a folder holding files
gsdistill did not write (a lone ``config.yaml`` included) is never written over without
``--overwrite``, for every command that writes a folder. Each case: exit code 2, one line, the
user's files byte for byte as they were."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from gsdistill.cli import main as gsdistill
from retriever_fixtures import tiny_beir, tiny_encoder  # noqa: F401  (fixtures)
from test_overwrite_safety import TINY, one_line, synthetic, tree, user_folder

MY_CONFIG = "# my own settings\nbuild:\n  pages_per_shard: 4\n"


# ---- row: gsdistill pretrain proj/config.yaml --run-dir proj [--overwrite] ------------------------------------
@pytest.fixture
def project(tmp_path) -> Path:
    """The user's project folder: their experiment file, their shards in data/, their notes; no run."""
    proj = tmp_path / "proj"
    assert synthetic(proj / "data", 8) == 0  # their shards (a build of theirs)
    user_folder(proj, {"config.yaml": yaml.safe_dump({"optim": {"steps": 2}}), "notes.md": "my notes"})
    return proj


def test_pretrain_never_writes_over_its_own_experiment_file(project, capsys):
    before = tree(project)
    capsys.readouterr()
    for extra in ((), ("--overwrite",)):
        assert gsdistill(["pretrain", str(project / "config.yaml"), "--run-dir", str(project), *TINY, *extra]) == 2
        line = one_line(capsys)
        assert "earlier run" not in line and "config.yaml" in line
        assert tree(project) == before


def test_pretrain_into_a_folder_of_the_users_files_says_so_and_keeps_them(project, tmp_path, capsys):
    os.rename(project / "config.yaml", tmp_path / "exp.yaml")  # the experiment elsewhere now
    before = tree(project)
    capsys.readouterr()
    assert gsdistill(["pretrain", str(tmp_path / "exp.yaml"), "--run-dir", str(project), *TINY]) == 2
    line = one_line(capsys)
    assert "earlier run" not in line and "data/" in line and "did not make" in line
    # --overwrite: the run writes data/ (synthetic pages), which is the user's: refused, nothing deleted
    assert gsdistill(["pretrain", str(tmp_path / "exp.yaml"), "--run-dir", str(project), *TINY, "--overwrite"]) == 2
    assert "data/" in one_line(capsys)
    assert tree(project) == before
    notes = user_folder(tmp_path / "notes", {"notes.md": "mine"})  # no name a run writes: "did not write"
    assert gsdistill(["pretrain", str(tmp_path / "exp.yaml"), "--run-dir", str(notes), *TINY]) == 2
    line = one_line(capsys)
    assert "earlier run" not in line and "did not write" in line and tree(notes) == {"notes.md": b"mine"}


# ---- row: a folder holding only the user's config.yaml (tuples build, eval retrieval, retriever eval) ----------
def test_tuples_build_never_replaces_a_users_config(tmp_path, capsys):
    out = user_folder(tmp_path / "out", {"config.yaml": MY_CONFIG})
    capsys.readouterr()
    for extra in ((), ("--overwrite",), ("--config", str(out / "config.yaml")),
                  ("--config", str(out / "config.yaml"), "--overwrite")):
        assert synthetic(out, 4, *extra) == 2, extra
        assert "config.yaml" in one_line(capsys)
        assert tree(out) == {"config.yaml": MY_CONFIG.encode()}


def test_retriever_eval_never_replaces_a_users_config(tiny_beir, tiny_encoder, tmp_path, capsys):
    out = user_folder(tmp_path / "out", {"config.yaml": MY_CONFIG})
    capsys.readouterr()
    for extra in ((), ("--overwrite",)):
        assert gsdistill(["retriever", "eval", f"data.path={tiny_beir}", f"model.encoder={tiny_encoder}",
                          "eval.k=5", "threads=1", "--out", str(out), *extra]) == 2
        assert "config.yaml" in one_line(capsys)
        assert tree(out) == {"config.yaml": MY_CONFIG.encode()}


# ---- rows: eval retrieval --out (a lone config.yaml, the user's metrics.csv/table.md, an earlier evaluation) --
@pytest.fixture
def retrieval_setup(tmp_path, monkeypatch):
    """Held-out pages, two fake pretrained runs and a fake text encoder (as tests/test_page_retrieval_cli.py)."""
    import gsdistill.models.text_encoder as te
    import gsdistill.pretrain.checkpoint as ckpt
    from gsdistill.tuples.store.writer import write_shards
    from test_page_retrieval import FakeTextEncoder, _model_for, _pages
    pages = _pages(24)
    for p in pages:
        p["source"] = "test"
    write_shards(pages, tmp_path / "pages", pages_per_shard=16)
    models = {"a": _model_for(pages, 2.0), "b": _model_for(pages, 0.5)}
    for name in models:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump({"views": {"global_size": 8}}))
    monkeypatch.setattr(ckpt, "load_pretrained", lambda path, device="cpu": models[Path(path).name])
    monkeypatch.setattr(te, "TextEncoder", lambda name=None, device="cpu": FakeTextEncoder())

    def evaluate(model: str, out: Path, *extra: str) -> int:
        return gsdistill(["eval", "retrieval", "--model", str(tmp_path / model), "--pages", str(tmp_path / "pages"),
                          "--out", str(out), "--allow-overlap", "retrieval.ks=[1]", "retrieval.seeds=[0]",
                          "retrieval.device=cpu", *extra])
    return tmp_path, evaluate


def test_eval_retrieval_never_writes_over_the_users_files(retrieval_setup, capsys):
    tmp, evaluate = retrieval_setup
    for name, text in (("config.yaml", MY_CONFIG), ("metrics.csv", "my,numbers\n"), ("table.md", "| my | table |\n")):
        out = user_folder(tmp / f"out_{name}", {name: text})
        capsys.readouterr()
        for extra in ((), ("--overwrite",)):
            assert evaluate("a", out, *extra) == 2, (name, extra)
            assert name in one_line(capsys)
            assert tree(out) == {name: text.encode()}


def test_eval_retrieval_refuses_an_earlier_evaluation_unless_overwrite(retrieval_setup, capsys):
    tmp, evaluate = retrieval_setup
    out = tmp / "report"
    assert evaluate("a", out) == 0
    (out / "my_notes.md").write_text("mine")
    before = tree(out)
    capsys.readouterr()
    assert evaluate("b", out) == 2  # an earlier evaluation (of another model): not silently overwritten
    assert "earlier evaluation" in one_line(capsys) and tree(out) == before
    assert evaluate("b", out, "--overwrite") == 0
    assert json.loads((out / "results.json").read_text())["b"]["model_dir"] == str(tmp / "b")
    assert (out / "my_notes.md").read_text() == "mine"


def test_eval_retrieval_config_is_an_input(retrieval_setup, capsys):
    tmp, evaluate = retrieval_setup
    out = user_folder(tmp / "out", {"exp.yaml": "retrieval:\n  n_gallery: 10\n"})
    capsys.readouterr()
    for extra in ((), ("--overwrite",)):
        assert evaluate("a", out, "--config", str(out / "exp.yaml"), *extra) == 2
        assert "exp.yaml" in one_line(capsys) and tree(out) == {"exp.yaml": b"retrieval:\n  n_gallery: 10\n"}


# ---- every other command writing a folder: a folder of the user's files is refused without --overwrite ---------
def test_a_folder_of_the_users_files_is_refused_by_every_writer(tmp_path, capsys):
    mine = {"notes.md": "mine"}
    out = user_folder(tmp_path / "out", mine)
    capsys.readouterr()
    assert synthetic(out, 4) == 2  # tuples build
    assert "did not write" in one_line(capsys) and tree(out) == {"notes.md": b"mine"}
    assert synthetic(tmp_path / "src", 8) == 0
    assert gsdistill(["eval", "split", str(tmp_path / "src"), "--train-out", str(out), "--eval-out",
                      str(tmp_path / "held"), "--fraction", "0.5"]) == 2
    assert "did not write" in one_line(capsys) and tree(out) == {"notes.md": b"mine"}
    assert not (tmp_path / "held").exists()
    assert gsdistill(["demo", "--out", str(out), "--size", "smoke"]) == 2
    assert "did not write" in one_line(capsys) and tree(out) == {"notes.md": b"mine"}
    # --overwrite writes beside them, they stay
    assert synthetic(out, 4, "--overwrite") == 0
    assert (out / "notes.md").read_text() == "mine" and (out / "manifest.json").is_file()
