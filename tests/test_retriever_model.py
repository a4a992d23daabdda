"""DualEncoder options: training only the top layers of the query tower."""
from __future__ import annotations

import pytest

from gsdistill.retriever.model import DualEncoder
from retriever_fixtures import tiny_encoder  # noqa: F401  (fixture)


def test_train_top_layers_freezes_everything_below(tiny_encoder, tmp_path):
    model = DualEncoder(tiny_encoder, shared=False, freeze_passage=True, train_top_layers=1)
    trainable = {n for n, p in model.query_encoder.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("encoder.layer.1.") for n in trainable)
    assert not any(p.requires_grad for p in model.passage_encoder.parameters())
    assert all(p.requires_grad for p in DualEncoder(tiny_encoder).query_encoder.parameters())
    back = DualEncoder.from_pretrained(model.save_pretrained(tmp_path / "m"))
    assert back.train_top_layers == 1
    with pytest.raises(ValueError, match="has 2 layers"):
        DualEncoder(tiny_encoder, train_top_layers=3)


def test_interpolate_weights_blends_with_the_start(tiny_encoder):
    import torch

    from gsdistill.retriever.pipeline import interpolate_weights

    model = DualEncoder(tiny_encoder)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    interpolate_weights(model, start, 0.25)
    name = "query_encoder.encoder.layer.0.attention.self.query.weight"
    assert torch.allclose(model.state_dict()[name], start[name] + 0.25)
    interpolate_weights(model, start, 0.0)
    assert torch.equal(model.state_dict()[name], start[name])
    with pytest.raises(ValueError, match="interpolate"):
        interpolate_weights(model, start, 1.5)
