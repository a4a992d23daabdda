"""Saved retrievers open in their ecosystem: a shared tower is a complete sentence-transformers
model (same embeddings to 1e-6, Normalize module, max_seq_length), separate towers are two of them
and their parent folder a sentence-transformers Router over both,
and ``retriever eval --model`` never writes into the model folder."""
from __future__ import annotations

import json

import pytest
import torch

from gsdistill.retriever.cli import main
from gsdistill.retriever.model import DualEncoder
from retriever_fixtures import QUERIES, TOPICS, tiny_beir, tiny_encoder  # noqa: F401  (fixtures)

PASSAGES = [t for texts in TOPICS.values() for t in texts]


def _st():
    return pytest.importorskip("sentence_transformers").SentenceTransformer


def test_shared_tower_is_a_complete_sentence_transformers_model(tiny_encoder, tmp_path):
    from transformers import AutoModel

    model = DualEncoder(tiny_encoder, query_max_length=16, passage_max_length=32)
    with torch.no_grad():  # move the weights off the initial draw, as training would
        for p in model.query_encoder.parameters():
            p.add_(0.01 * torch.randn_like(p))
    out = model.save_pretrained(tmp_path / "m")
    st = _st()(str(out), device="cpu")
    names = [type(m).__name__ for m in st]
    assert names == ["Transformer", "Pooling", "Normalize"] and st.max_seq_length == 32
    ours = model.encode(PASSAGES, "passage")
    theirs = torch.from_numpy(st.encode(PASSAGES, batch_size=4))
    assert torch.allclose(ours, theirs, atol=1e-6) and torch.allclose(theirs.norm(dim=1), torch.ones(len(PASSAGES)))
    assert AutoModel.from_pretrained(str(out)).config.hidden_size == 32  # plain transformers opens it too
    back = DualEncoder.from_pretrained(out)
    assert torch.allclose(back.encode(list(QUERIES.values()), "query"), model.encode(list(QUERIES.values()), "query"))
    assert "SentenceTransformer(path)" in (out / "README.md").read_text()


def test_real_minilm_round_trip_matches_sentence_transformers(tmp_path):
    model = DualEncoder(passage_max_length=128)
    out = model.save_pretrained(tmp_path / "minilm")
    st = _st()(str(out), device="cpu")
    assert st.max_seq_length == 128 and type(st[2]).__name__ == "Normalize"
    ours = model.encode(PASSAGES[:6], "passage")
    assert torch.allclose(ours, torch.from_numpy(st.encode(PASSAGES[:6])), atol=1e-6)


def test_separate_towers_are_two_sentence_transformers_models(tiny_encoder, tmp_path):
    model = DualEncoder(tiny_encoder, shared=False, query_max_length=16, passage_max_length=32, normalize=False)
    with torch.no_grad():
        for p in model.query_encoder.parameters():
            p.add_(0.01 * torch.randn_like(p))
    out = model.save_pretrained(tmp_path / "two")
    q_st, p_st = _st()(str(out / "query_encoder"), device="cpu"), _st()(str(out / "passage_encoder"), device="cpu")
    assert (q_st.max_seq_length, p_st.max_seq_length) == (16, 32)
    assert [type(m).__name__ for m in q_st] == ["Transformer", "Pooling"]  # normalize=False: no Normalize
    queries = list(QUERIES.values())
    assert torch.allclose(model.encode(queries, "query"), torch.from_numpy(q_st.encode(queries)), atol=1e-6)
    assert torch.allclose(model.encode(PASSAGES, "passage"), torch.from_numpy(p_st.encode(PASSAGES)), atol=1e-6)
    assert not torch.allclose(model.encode(queries, "query"), model.encode(queries, "passage"))
    pair = _st()(str(out), device="cpu")  # the parent folder: a Router over the two towers, no weights copied
    assert torch.allclose(model.encode(queries, "query"), torch.from_numpy(pair.encode_query(queries)), atol=1e-6)
    assert torch.allclose(model.encode(PASSAGES, "passage"), torch.from_numpy(pair.encode_document(PASSAGES)),
                          atol=1e-6)
    assert not list(out.glob("*.safetensors"))
    back = DualEncoder.from_pretrained(out)
    assert torch.allclose(back.encode(queries, "query"), model.encode(queries, "query"), atol=1e-6)
    assert "query_encoder" in (out / "README.md").read_text()


def test_eval_never_writes_into_the_model_folder(tiny_beir, tiny_encoder, tmp_path, capsys):
    model_dir = DualEncoder(tiny_encoder, passage_max_length=32).save_pretrained(tmp_path / "model")
    before = sorted(p.relative_to(model_dir) for p in model_dir.rglob("*"))
    common = [f"data.path={tiny_beir}", "eval.k=10", f"run.dir={tmp_path / 'runs'}"]
    assert main(["eval", "--model", str(model_dir), *common]) == 0
    assert sorted(p.relative_to(model_dir) for p in model_dir.rglob("*")) == before
    written = tmp_path / "runs" / "eval" / f"{tmp_path.name}-model"
    assert json.loads((written / "metrics.json").read_text())["counts"]["queries_scored"] == 6
    assert (written / "data_summary.json").is_file()
    assert main(["eval", "--model", str(model_dir), "--out", str(model_dir / "eval"), *common]) == 2
    assert "inside the model folder" in capsys.readouterr().err
    assert sorted(p.relative_to(model_dir) for p in model_dir.rglob("*")) == before
