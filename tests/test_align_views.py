"""`objective.align_views`: the alignment heads read unmasked global views (a second student pass) or
the iBOT-masked ones. docs/learning.md measured why: masks hide the boxes a page's descriptors describe."""
from __future__ import annotations

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import tensor_batch

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "model.geom_pool_grid=2", "views.mask_prob=1.0", "views.mask_ratio=[0.5,0.5]"]
ALIGN_ONLY = ["objective.distill=false", "objective.ibot=false", "objective.koleo=false"]


def _terms(*extra):
    cfg = load_config("pretrain", None, TINY + list(extra))
    torch.manual_seed(0)  # backbone and alignment heads are built first: same weights in every variant
    model = GSDistill(cfg).train()
    batch = tensor_batch(cfg, 4, seed=3)
    assert batch["masks"].any(), "the batch must carry iBOT masks for this test to mean anything"
    return model(batch)


def test_unmasked_alignment_equals_alignment_without_ibot():
    full = _terms("objective.align_views=unmasked", "objective.koleo=false", "objective.distill=false")
    plain = _terms(*ALIGN_ONLY)
    for head in ("sem", "geom"):
        torch.testing.assert_close(full[head], plain[head], rtol=1e-6, atol=1e-6)
    assert "ibot" in full and "ibot" not in plain


def test_masked_alignment_reads_the_masked_views():
    masked = _terms("objective.align_views=masked", "objective.koleo=false", "objective.distill=false")
    plain = _terms(*ALIGN_ONLY)
    assert (masked["geom"] - plain["geom"]).abs() > 1e-4


def test_unknown_align_views_is_a_config_error():
    from gsdistill.config import ConfigError
    with pytest.raises(ConfigError, match="'objective.align_views': 'hidden' is not one of unmasked | visible | masked"):
        _terms("objective.align_views=hidden")
