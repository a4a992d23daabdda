"""Training groups (G, M, hard negatives, graded labels) and the in-batch label matrix."""
from __future__ import annotations

import pytest
import torch

from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.groups import GroupSampler, batches, candidate_labels
from retriever_fixtures import tiny_beir  # noqa: F401  (fixture)


def test_groups_respect_g_m_and_keep_grades(tiny_beir):
    data = load_beir(tiny_beir)
    data.negatives["q-cat"] = ["paris-0", "cat-1"]  # a listed "negative" that is relevant must be dropped
    groups = GroupSampler(data, group_size=8, max_positives=2, seed=3).epoch_groups(0)
    assert sorted(g.qid for g in groups) == data.judged_queries()
    for g in groups:
        relevant = {data.doc_index[d] for d, v in data.qrels[g.qid].items() if v >= 1}
        assert len(g.doc_idx) == 8 and len(set(g.doc_idx)) == 8
        assert g.grades[:2] == [data.qrels[g.qid][data.doc_ids[i]] for i in g.doc_idx[:2]]
        assert all(v >= 1 for v in g.grades[:2]) and all(v == 0 for v in g.grades[2:])
        assert not relevant & set(g.doc_idx[2:])
        if g.qid == "q-cat":  # hard negative first, then the judged non-relevant doc, then random fill
            assert data.doc_index["paris-0"] in g.doc_idx and data.doc_index["filler-0"] in g.doc_idx


def test_groups_rotate_with_epoch_and_are_seeded(tiny_beir):
    data = load_beir(tiny_beir)
    s = GroupSampler(data, group_size=4, max_positives=1, seed=0)
    e0, e0b = s.epoch_groups(0), GroupSampler(data, group_size=4, max_positives=1, seed=0).epoch_groups(0)
    assert [g.doc_idx for g in e0] == [g.doc_idx for g in e0b]
    firsts = {tuple(sorted((g.qid, g.doc_idx[0]) for g in s.epoch_groups(e))) for e in range(6)}
    assert len(firsts) > 1  # the positive in the single slot changes across epochs
    assert [len(b) for b in batches(e0, 4)] == [4, 2] and [len(b) for b in batches(e0, 4, drop_last=True)] == [4]


def test_group_argument_errors(tiny_beir):
    data = load_beir(tiny_beir)
    with pytest.raises(ValueError, match="max_positives"):
        GroupSampler(data, group_size=4, max_positives=4)
    with pytest.raises(ValueError, match="no query with a relevant document"):
        GroupSampler(data.subset([]))


def test_candidate_labels_cross_group_positives_and_duplicates(tiny_beir):
    data = load_beir(tiny_beir)
    ix = data.doc_index
    cand = torch.tensor([ix["cat-0"], ix["filler-0"], ix["paris-1"], ix["cat-2"], ix["cat-0"]])
    grades, valid = candidate_labels(["q-cat", "q-paris"], cand, data)
    assert grades.tolist() == [[2, 0, 0, 1, 2], [0, 0, 1, 0, 0]]
    assert valid.tolist() == [[True, True, True, True, False]] * 2
    own = torch.tensor([[True, True, False, False, True], [False, False, True, True, True]])
    assert candidate_labels(["q-cat", "q-paris"], cand, data, visible=own)[1].tolist() == \
        [[True, True, False, False, False], [False, False, True, True, True]]
    noisy = {"q-cat": {"filler-0": 1}}
    assert candidate_labels(["q-cat"], cand, data, noisy)[0].tolist() == [[0, 1, 0, 0, 0]]
