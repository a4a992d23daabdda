"""adapter_features: what each pyramid level reads (the last block, one block per level, or a learned mix)."""
from __future__ import annotations

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.detect.modules import SimpleFeaturePyramid, ViTBackbone, detector_yaml, feature_blocks
from gsdistill.detect.pipeline import build_detector, export_detector
from gsdistill.detect.safe_load import load_yolo
from gsdistill.models.backbone import create_backbone, save_backbone

TINY = {"name": "vit_tiny_patch16_224", "depth": 4, "embed_dim": 32, "num_heads": 2}


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory):
    torch.manual_seed(0)
    return save_backbone(create_backbone(TINY), TINY, tmp_path_factory.mktemp("bb"))


def _cfg(**over):
    return load_config("detect", "cpu_smoke", [f"{k}={v}" for k, v in over.items()])


def test_feature_blocks():
    assert feature_blocks("last", 4) == [4] and feature_blocks("mix", 4) == [1, 2, 3, 4]
    assert feature_blocks("levels", 4) == [2, 3, 4] and feature_blocks("levels", 12) == [6, 9, 12]
    assert feature_blocks("levels", 1) == [1, 1, 1]
    with pytest.raises(ValueError, match="adapter_features must be one of"):
        feature_blocks("all", 4)


def test_backbone_returns_the_normed_blocks_it_was_asked_for():
    vit = ViTBackbone("vit_tiny_patch16_224", {k: v for k, v in TINY.items() if k != "name"}, blocks=[2, 4])
    x = torch.rand(2, 3, 64, 96)
    out = vit(x)
    assert out.shape == (2, 64, 4, 6)
    # the same maps by hand: blocks run one after another, each output through the final norm
    inner = vit.vit
    with torch.no_grad():
        t = (x - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)) / torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
        t = inner.norm_pre(inner._pos_embed(inner.patch_embed(t)))
        maps = []
        for block in inner.blocks:
            t = block(t)
            maps.append(inner.norm(t)[:, inner.num_prefix_tokens:].reshape(2, 4, 6, 32).permute(0, 3, 1, 2))
    torch.testing.assert_close(out, torch.cat([maps[1], maps[3]], 1), atol=1e-5, rtol=1e-5)
    last = ViTBackbone("vit_tiny_patch16_224", {k: v for k, v in TINY.items() if k != "name"})
    last.load_state_dict(vit.state_dict())
    torch.testing.assert_close(last(x), maps[3], atol=1e-5, rtol=1e-5)  # default: the last block only
    with pytest.raises(ValueError, match="out of range"):
        ViTBackbone("vit_tiny_patch16_224", {"depth": 2, "embed_dim": 32, "num_heads": 2}, blocks=[3])


def test_levels_read_one_block_each_and_mix_starts_even():
    torch.manual_seed(0)
    maps = [torch.randn(2, 8, 4, 6) for _ in range(3)]
    x = torch.cat(maps, 1)
    levels = SimpleFeaturePyramid(8, 4, 16, features="levels", n_blocks=3)
    assert all(torch.equal(a, b) for a, b in zip(levels.level_inputs(x), maps))
    mix = SimpleFeaturePyramid(8, 4, 16, features="mix", n_blocks=3)
    for inp in mix.level_inputs(x):  # zero logits: the mean of the blocks
        torch.testing.assert_close(inp, sum(maps) / 3)
    with torch.no_grad():
        mix.mix.copy_(torch.tensor([[50.0, 0, 0], [0, 50.0, 0], [0, 0, 50.0]]))
    for inp, m in zip(mix.level_inputs(x), maps):  # a peaked mix = that block alone
        torch.testing.assert_close(inp, m, atol=1e-4, rtol=0)
    out = mix(x)
    assert [tuple(o.shape) for o in out] == [(2, 4, 8, 12), (2, 4, 4, 6), (2, 4, 2, 3)]
    out[0].sum().backward()
    assert mix.mix.grad is not None and mix.mix.grad[0].abs().sum() > 0  # the mix trains with the head
    with pytest.raises(ValueError, match="levels 3"):
        SimpleFeaturePyramid(8, 4, 16, features="levels", n_blocks=2)


@pytest.mark.parametrize("features", ["levels", "mix"])
def test_detector_with_block_features_trains_only_the_head_and_reloads(backbone_dir, tmp_path, features):
    cfg = _cfg(adapter_features=features)
    det = build_detector(backbone_dir, nc=3, cfg=cfg, names=["a", "b", "c"])
    vit, pyramid = det.model.model[0], det.model.model[1]
    assert vit.blocks == feature_blocks(features, 4) and pyramid.features == features
    det.model.eval()
    x = torch.rand(1, 3, 96, 128)
    ref = det.model(x)[0]
    det.save(str(tmp_path / "det.pt"))
    again = load_yolo(tmp_path / "det.pt", safe=True).model.float().eval()  # weights_only load knows the classes
    assert again.model[0].blocks == vit.blocks and again.model[1].features == features
    # checkpoints hold fp16 weights: the reloaded detector gives the fp16-rounded model's outputs
    torch.testing.assert_close(again(x)[0], det.model.half().float()(x)[0], atol=1e-2, rtol=1e-3)
    assert ref.shape == again(x)[0].shape
    exported = load_yolo(export_detector(backbone_dir, ["a", "b", "c"], cfg, tmp_path / "export" / "det.pt"), safe=True)
    trainable = {n.split(".")[1] for n, p in exported.model.named_parameters() if p.requires_grad}
    assert "1" in trainable  # pyramid (and its mix) train; freeze=[0] keeps the ViT out at train time


def test_yaml_of_the_default_keeps_the_old_layer_arguments():
    """``last`` writes the layer arguments detectors were saved with before the option existed."""
    spec = detector_yaml("vit_tiny_patch16_224", {}, 192, 16, nc=5)
    assert spec["backbone"][0][3] == ["vit_tiny_patch16_224", {}, True]
    assert spec["backbone"][1][3] == [192, 128, 16, False]
    with pytest.raises(ValueError, match="needs the ViT's depth"):
        detector_yaml("vit_tiny_patch16_224", {}, 192, 16, nc=5, features="mix")
