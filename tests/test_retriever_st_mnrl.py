"""The sentence-transformers MNRL row: ST's own loss on (query, positive, mined negative) triplets."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gsdistill.retriever.pipeline import train_and_evaluate
from gsdistill.retriever.st_mnrl import SentenceTransformersMNRL
from retriever_fixtures import retriever_cfg, tiny_beir, tiny_encoder  # noqa: F401  (fixtures)


def test_st_mnrl_is_cross_entropy_over_all_positives_and_negatives():
    pytest.importorskip("sentence_transformers")
    g = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(3, 8, generator=g), dim=-1)
    p = F.normalize(torch.randn(6, 8, generator=g), dim=-1)  # groups: (pos, neg) per query
    cands = torch.cat([p[0::2], p[1::2]])  # ST order: every positive, then every negative
    expected = F.cross_entropy(20.0 * q @ cands.T, torch.arange(3))
    assert SentenceTransformersMNRL()(q, p).item() == pytest.approx(expected.item(), rel=1e-6)
    with pytest.raises(ValueError, match="groups of 2"):
        SentenceTransformersMNRL()(q, p[:5])


def test_st_mnrl_trains_with_mined_negatives(tiny_beir, tiny_encoder, tmp_path):
    pytest.importorskip("sentence_transformers")
    cfg = retriever_cfg(tiny_beir, tmp_path, f"model.encoder={tiny_encoder}", "loss.name=st_mnrl", "groups.size=2",
                        "groups.max_positives=1", "negatives.method=dense", "train.epochs=2", "data.folds=3")
    summary = train_and_evaluate(cfg, tmp_path / "r", progress=False, save_model=False)
    assert summary["negatives"]["mean_per_query"] > 0 and summary["first_loss"] > 0
    assert summary["eval"]["counts"]["queries_scored"] == 2
