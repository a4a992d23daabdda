"""Pseudo-queries from the corpus alone (tools/experiments/retriever_pseudo_queries.py) and the training hook."""
from __future__ import annotations

import json

from gsdistill.retriever.data import RetrievalData
from retriever_fixtures import retriever_cfg, tiny_beir, tiny_encoder  # noqa: F401  (fixtures)
from tool_loader import load_tool as _load


def load_tool():
    return _load("experiments/retriever_pseudo_queries.py")


def corpus() -> RetrievalData:
    docs = {
        "<dbpedia:Barton_Fink>": "Barton Fink Barton Fink is a 1991 American period film written by the Coen brothers.",
        "<dbpedia:John_Turturro>": "John Turturro John Turturro is an American actor. He starred in Barton Fink.",
        "<dbpedia:John_Goodman>": "John Goodman John Goodman is an American actor, seen in Barton Fink (1991).",
        "<dbpedia:Fink_(band)>": "Fink Fink was a German band. Barton Finkel is unrelated.",
    }
    return RetrievalData(list(docs), list(docs.values()), {"q1": "coen film"}, {"q1": {"<dbpedia:Barton_Fink>": 2}},
                         source="tiny")


def test_entity_queries_take_the_entity_and_the_entities_that_name_it():
    tool = load_tool()
    assert tool.entity_title("<dbpedia:Dan_Patrick_(politician)>") == "Dan Patrick"
    got = tool.entity_queries(corpus())
    # "Barton Fink" is named by two other entities; "Barton Finkel" does not count (word boundary);
    # nobody names the actors; "Fink" is too short a title (< 5 characters)
    assert got == {"pseudo-entity:<dbpedia:Barton_Fink>": ("Barton Fink", {
        "<dbpedia:Barton_Fink>": 2, "<dbpedia:John_Turturro>": 1, "<dbpedia:John_Goodman>": 1})}


def test_type_queries_group_entities_by_their_type_phrase():
    got = load_tool().type_queries(corpus())
    assert got["pseudo-type:american actor"] == ("american actor", {"<dbpedia:John_Turturro>": 1,
                                                                      "<dbpedia:John_Goodman>": 1})
    assert got["pseudo-type:german band"] == ("german band", {"<dbpedia:Fink_(band)>": 1})
    assert got["pseudo-type:1991 american period film written by the coen"][1] == {"<dbpedia:Barton_Fink>": 1}


def test_augment_keeps_the_real_queries_and_adds_the_pseudo_ones():
    data = corpus()
    out = load_tool().add_queries("entity")(data)
    assert out.queries["q1"] == "coen film" and out.qrels["q1"] == data.qrels["q1"]
    assert set(out.queries) == {"q1", "pseudo-entity:<dbpedia:Barton_Fink>"}
    assert out.judged_queries() == sorted(out.queries) and data.queries == {"q1": "coen film"}  # input untouched


def test_train_and_evaluate_trains_on_the_augmented_queries(tiny_beir, tiny_encoder, tmp_path):
    from gsdistill.retriever.beir import load_beir
    from gsdistill.retriever.pipeline import train_and_evaluate

    data = load_beir(tiny_beir)
    doc = data.doc_ids[0]

    def augment(train: RetrievalData) -> RetrievalData:
        return RetrievalData(train.doc_ids, train.doc_texts, {**train.queries, "extra": "made up"},
                             {**train.qrels, "extra": {doc: 1}}, source=train.source)

    cfg = retriever_cfg(tiny_beir, tmp_path, f"model.encoder={tiny_encoder}", "negatives.method=bm25",
                        "negatives.per_query=2", "train.epochs=1", "data.folds=2")
    plain = train_and_evaluate(cfg, tmp_path / "a", progress=False, save_model=False)
    more = train_and_evaluate(cfg, tmp_path / "b", progress=False, save_model=False, augment_train=augment)
    assert more["train_queries"] == plain["train_queries"] + 1
    assert more["negatives"]["queries"] == plain["negatives"]["queries"] + 1  # mined for it too
    # the evaluation data is untouched: the same held-out queries are scored
    assert json.loads((tmp_path / "a" / "eval" / "per_query.json").read_text()).keys() == \
        json.loads((tmp_path / "b" / "eval" / "per_query.json").read_text()).keys()
