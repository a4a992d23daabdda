"""The objective hands ELS the candidates' similarities and runs every noisy-label baseline."""
from __future__ import annotations

import pytest
import torch

from gsdistill.losses import get_loss
from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.groups import GroupSampler, candidate_labels
from gsdistill.retriever.objective import loss_from_embeddings, step_inputs
from retriever_fixtures import tiny_beir  # noqa: F401  (fixture)

BASELINES = ["sum_marg_lh", "nce", "gce", "agce", "aul", "label_smoothing", "els", "label_relaxation", "nce_agce",
             "nce_aul"]


def _batch(data):
    groups = GroupSampler(data, group_size=4, max_positives=2, seed=0).epoch_groups(0)[:3]
    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(3, 8, generator=g), dim=-1)
    p = torch.nn.functional.normalize(torch.randn(12, 8, generator=g), dim=-1)
    return step_inputs(groups, data), q, p


def test_els_gets_the_cosines_between_candidates(tiny_beir):
    data = load_beir(tiny_beir)
    inputs, q, p = _batch(data)
    scale = lambda x: x / 0.05  # noqa: E731
    loss_fn = get_loss("els")
    value = loss_from_embeddings(loss_fn, "els", q, p, scale, inputs, data, data.qrels, cross_device=False)
    grades, valid = candidate_labels(inputs.qids, inputs.cand_idx, data, data.qrels)
    direct = loss_fn(scale(q @ p.T), grades > 0, valid, doc_sim=p @ p.T)
    assert value.item() == pytest.approx(direct.item(), rel=1e-6)


@pytest.mark.parametrize("name", BASELINES)
def test_every_paper_004_baseline_runs_in_the_objective(tiny_beir, name):
    data = load_beir(tiny_beir)
    inputs, q, p = _batch(data)
    q.requires_grad_(True)
    value = loss_from_embeddings(get_loss(name), name, q, p, lambda x: x / 0.05, inputs, data, data.qrels,
                                 cross_device=False)
    value.backward()
    assert torch.isfinite(value) and value.item() > 0 and q.grad.abs().sum() > 0
