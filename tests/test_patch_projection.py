"""The ViT's patch convolution as a reshape and one matrix product (gsdistill.models.backbone):
the same numbers and gradients as ``Conv2d``, the same state dict, and the convolution wherever the
reshape cannot express it."""
from __future__ import annotations

import pytest
import torch

from gsdistill.models.backbone import (PatchProjection, create_backbone, fast_patch_projection, load_backbone,
                                       save_backbone)

CFG = {"name": "vit_tiny_patch16_224", "img_size": 64, "depth": 1}


@pytest.mark.parametrize("hw", [(64, 64), (96, 32), (48, 80)])
def test_matches_the_convolution_in_float64_with_gradients(hw):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 16, 16).double()
    proj = torch.nn.Conv2d(3, 8, 16, 16).double()
    proj.load_state_dict(conv.state_dict())
    fast_patch_projection(torch.nn.ModuleDict({"patch_embed": torch.nn.ModuleDict({"proj": proj})}))
    assert type(proj) is PatchProjection
    x = torch.randn(2, 3, *hw, dtype=torch.float64, requires_grad=True)
    y_ref, y = conv(x), proj(x)
    assert y.shape == y_ref.shape and not y.is_contiguous()  # an NCHW view of an NHWC product
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    g = torch.randn_like(y)
    grads_ref = torch.autograd.grad(y_ref, [x, conv.weight, conv.bias], g)
    grads = torch.autograd.grad(y, [x, proj.weight, proj.bias], g)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_falls_back_to_the_convolution_where_the_reshape_cannot_express_it():
    torch.manual_seed(0)
    for kwargs, hw in [({"stride": 16}, (40, 40)),           # a ragged edge: 40 is not a multiple of 16
                       ({"stride": 8}, (32, 32)),            # overlapping patches
                       ({"stride": 16, "padding": 2}, (32, 32))]:
        conv = torch.nn.Conv2d(3, 4, 16, **kwargs)
        proj = PatchProjection(3, 4, 16, **kwargs)
        proj.load_state_dict(conv.state_dict())
        x = torch.randn(1, 3, *hw)
        torch.testing.assert_close(proj(x), conv(x))


def test_backbones_use_it_and_keep_their_weights(tmp_path):
    torch.manual_seed(0)
    model = create_backbone(CFG)
    assert type(model.patch_embed.proj) is PatchProjection
    plain = create_backbone(CFG)
    plain.patch_embed.proj.__class__ = torch.nn.Conv2d
    plain.load_state_dict(model.state_dict())  # same keys and shapes
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(model(x), plain(x), rtol=1e-5, atol=1e-5)
    loaded = load_backbone(save_backbone(model, CFG, tmp_path / "bb"))
    assert type(loaded.patch_embed.proj) is PatchProjection
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
