"""Shared fixtures for the retriever tests: a tiny BEIR data set and a tiny random BERT encoder."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

TOPICS = {
    "cat": ["The cat is a small domesticated carnivorous mammal kept as a pet.",
            "Cats purr, hunt mice and sleep for most of the day.",
            "A kitten is a young cat that drinks milk."],
    "paris": ["Paris is the capital and largest city of France.",
              "The Eiffel Tower stands in Paris on the Seine river.",
              "Paris hosts the Louvre museum with the Mona Lisa."],
    "python": ["Python is a programming language with dynamic typing.",
               "Guido van Rossum created the Python programming language.",
               "Python code uses indentation to mark blocks."],
    "volcano": ["A volcano erupts lava, ash and gases from the earth's crust.",
                "Mount Etna in Sicily is an active volcano.",
                "Magma that reaches the surface of a volcano is called lava."],
    "piano": ["The piano is a keyboard instrument with hammers striking strings.",
              "Mozart and Chopin wrote many works for the piano.",
              "A grand piano has horizontal strings and a large lid."],
    "football": ["Football is a team sport played with a ball between two goals.",
                 "The World Cup is the biggest football tournament.",
                 "A football match lasts ninety minutes in two halves."],
}
QUERIES = {"cat": "what pet purrs and hunts mice", "paris": "capital city of France",
           "python": "which programming language uses indentation", "volcano": "mountain that erupts lava",
           "piano": "keyboard instrument with strings and hammers", "football": "sport with goals and a world cup"}
FILLER = [f"Unrelated filler passage number {i} about weather, cooking, trains and gardens." for i in range(12)]


def write_beir(folder: Path, header: bool = True) -> Path:
    """Tiny BEIR folder: 6 queries, 18 topical docs (grades 2, 1, 1 per topic) + 12 filler docs."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    docs, qrels = [], []
    for topic, texts in TOPICS.items():
        for i, text in enumerate(texts):
            docs.append({"_id": f"{topic}-{i}", "title": topic.capitalize(), "text": text})
            qrels.append((f"q-{topic}", f"{topic}-{i}", 2 if i == 0 else 1))
        qrels.append((f"q-{topic}", "filler-0", 0))
    docs += [{"_id": f"filler-{i}", "title": "", "text": t} for i, t in enumerate(FILLER)]
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (folder / "queries.jsonl").write_text(
        "\n".join(json.dumps({"_id": f"q-{t}", "text": q}) for t, q in QUERIES.items()) + "\n")
    lines = (["query-id\tcorpus-id\tscore"] if header else []) + [f"{q}\t{d}\t{g}" for q, d, g in qrels]
    (folder / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture()
def tiny_beir(tmp_path) -> Path:
    return write_beir(tmp_path / "beir")


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory) -> str:
    """A 2-layer random BERT with all-MiniLM-L6-v2's tokenizer: fast tests of the training plumbing."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from gsdistill.models.text_encoder import default_encoder_path

    out = tmp_path_factory.mktemp("tiny_bert")
    tok = AutoTokenizer.from_pretrained(str(default_encoder_path()), local_files_only=True)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.1)
    import torch
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def retriever_cfg(beir: Path, run_dir: Path, *overrides: str):
    from gsdistill.config import load_config

    return load_config("retriever", None, [f"data.path={beir}", f"run.dir={run_dir}", "run.name=test",
                                           "model.query_max_length=16", "model.passage_max_length=32",
                                           "train.batch_size=3", "eval.k=20", *overrides])
