"""The Ultralytics detector around the ViT: shapes, eval-mode freezing, export, reload in a new process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.detect.evaluate import param_counts
from gsdistill.detect.modules import SimpleFeaturePyramid, ViTBackbone
from gsdistill.detect.pipeline import build_detector, export_detector
from gsdistill.models.backbone import create_backbone, load_backbone, save_backbone

TINY = {"name": "vit_tiny_patch16_224", "depth": 2, "embed_dim": 64, "num_heads": 2}


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_backbone(create_backbone(TINY), TINY, tmp_path_factory.mktemp("bb"))


def _cfg(**over):
    return load_config("detect", "cpu_smoke", [f"{k}={v}" for k, v in over.items()])


def test_device_goes_through_the_one_resolver():
    from gsdistill.detect.pipeline import resolve_device
    from gsdistill.errors import InputError
    assert resolve_device("0") == "0" and resolve_device("0,1") == "0,1"  # Ultralytics' CUDA indices, as given
    assert resolve_device("cpu") == "cpu"
    assert resolve_device(None) == resolve_device("auto") == ("0" if torch.cuda.is_available() else "cpu")
    with pytest.raises(InputError, match="device must be"):
        resolve_device("gpu")


def test_backbone_stays_in_eval_mode_and_pyramid_strides():
    vit = ViTBackbone("vit_tiny_patch16_224", {"depth": 1, "embed_dim": 32, "num_heads": 2, "drop_path_rate": 0.5})
    vit.train()
    assert not any(m.training for m in vit.modules())  # drop-path off although train() was asked
    x = torch.randn(2, 3, 128, 192)
    torch.testing.assert_close(vit(x), vit(x))  # deterministic: no dropout / drop-path
    feats = vit(x)
    assert feats.shape == (2, 32, 8, 12) and not feats.requires_grad
    levels = SimpleFeaturePyramid(32, 16, 16)(feats)
    assert [tuple(f.shape) for f in levels] == [(2, 16, 16, 24), (2, 16, 8, 12), (2, 16, 4, 6)]
    trainable = ViTBackbone("vit_tiny_patch16_224", {"depth": 1, "embed_dim": 32, "num_heads": 2}, frozen=False)
    assert trainable.train().training and trainable(x).requires_grad
    with pytest.raises(ValueError, match="not a multiple of the patch size"):
        vit(torch.randn(1, 3, 100, 96))


def test_input_norm_makes_the_pyramid_blind_to_channel_scale(backbone_dir):
    """adapter_input_norm: each channel of the frozen map standardised, so a backbone whose features are
    scaled or shifted per channel gives the head the same input; without it the head sees the difference."""
    torch.manual_seed(0)
    feats = torch.randn(4, 32, 8, 12)
    scale, shift = 10 ** (torch.rand(1, 32, 1, 1) * 2 - 1), torch.randn(1, 32, 1, 1) * 5  # x0.1..x10
    with_norm, without = SimpleFeaturePyramid(32, 16, 16, input_norm=True), SimpleFeaturePyramid(32, 16, 16)
    for pyramid, same in ((with_norm, True), (without, False)):
        pyramid.train()
        a, b = pyramid(feats), pyramid(feats * scale + shift)
        assert all(torch.allclose(x, y, atol=1e-3) for x, y in zip(a, b)) is same
    det = build_detector(backbone_dir, nc=5, cfg=_cfg(adapter_input_norm=True))
    pyramid = det.model.model[1]
    assert isinstance(pyramid.input_norm, torch.nn.BatchNorm2d) and pyramid.input_norm.weight is None
    assert build_detector(backbone_dir, nc=5, cfg=_cfg()).model.model[1].input_norm is None  # default: off


def test_build_detector_loads_backbone_and_counts_params(backbone_dir):
    det = build_detector(backbone_dir, nc=5, cfg=_cfg(), names=["a", "b", "c", "d", "e"])
    ref = load_backbone(backbone_dir)
    for k, v in ref.state_dict().items():
        assert torch.equal(det.model.model[0].vit.state_dict()[k], v), k
    total, trainable = param_counts(det.model, frozen=True)
    vit_n = sum(p.numel() for p in ref.parameters())
    dfl_n = sum(p.numel() for n, p in det.model.named_parameters() if ".dfl" in n)
    assert total == sum(p.numel() for p in det.model.parameters())
    assert trainable == total - vit_n - dfl_n
    assert det.model.stride.tolist() == [8.0, 16.0, 32.0] and det.model.names[4] == "e"


def test_pan_neck_feeds_the_head_from_its_own_layers(backbone_dir, tmp_path):
    """adapter_neck=pan: YOLOv10's neck between the pyramid and v10Detect (layers 5-16), P3 / P4 / P5
    out at c / 2c / 4c channels and strides 8 / 16 / 32; all of it trains, the ViT stays frozen; the
    exported detector reloads and gives the same output."""
    from ultralytics.nn.modules import C2f, C2fCIB, SCDown, v10Detect
    plain = build_detector(backbone_dir, nc=5, cfg=_cfg(adapter_channels=16))
    det = build_detector(backbone_dir, nc=5, cfg=_cfg(adapter_channels=16, adapter_neck="pan"))
    layers = det.model.model
    assert len(layers) == 18 and len(plain.model.model) == 6
    assert isinstance(layers[-1], v10Detect) and layers[-1].f == [10, 13, 16]
    assert [type(layers[i]) for i in (10, 13, 14, 16)] == [C2f, C2f, SCDown, C2fCIB]
    assert det.model.stride.tolist() == [8.0, 16.0, 32.0]
    x = torch.rand(1, 3, 128, 160)
    feats, keep = {}, [10, 13, 16]
    for i in keep:
        layers[i].register_forward_hook(lambda m, a, out, i=i: feats.__setitem__(i, out))
    det.model.eval()
    with torch.no_grad():
        det.model(x)
    assert [tuple(feats[i].shape) for i in keep] == [(1, 16, 16, 20), (1, 32, 8, 10), (1, 64, 4, 5)]
    (total, trainable), (_, plain_trainable) = param_counts(det.model, True), param_counts(plain.model, True)
    assert trainable > plain_trainable
    assert trainable == total - sum(p.numel() for p in load_backbone(backbone_dir).parameters()) - sum(
        p.numel() for n, p in det.model.named_parameters() if ".dfl" in n)
    with pytest.raises(ValueError, match="adapter_neck must be one of"):
        build_detector(backbone_dir, nc=5, cfg=_cfg(adapter_neck="fpn"))
    pt = export_detector(backbone_dir, ["a", "b"], _cfg(adapter_channels=16, adapter_neck="pan"), tmp_path / "d.pt")
    from ultralytics import YOLO
    again = YOLO(str(pt)).model.eval()
    assert len(again.model) == 18 and again.model[-1].f == [10, 13, 16]


def test_wrong_backbone_checkpoints_are_clear_errors(backbone_dir, tmp_path):
    bad = tmp_path / "bad"
    save_backbone(create_backbone(TINY), TINY, bad)
    meta = json.loads((bad / "backbone.json").read_text())
    meta["kwargs"]["embed_dim"] = 96  # json promises a wider ViT than the weights hold
    (bad / "backbone.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not fit.*shape mismatches"):
        build_detector(bad, nc=3, cfg=_cfg())
    with pytest.raises(FileNotFoundError, match="no backbone.json"):
        build_detector(tmp_path / "missing", nc=3, cfg=_cfg())


def test_export_reloads_in_a_new_process(backbone_dir, tmp_path):
    pt = export_detector(backbone_dir, ["text", "title", "list"], _cfg(adapter_channels=16), tmp_path / "det.pt")
    info = json.loads((tmp_path / "params.json").read_text())
    assert 0 < info["params_trainable"] < info["params_total"]
    x = torch.rand(1, 3, 128, 160)
    torch.save(x, tmp_path / "x.pt")
    code = ("import json, sys, torch\nfrom ultralytics import YOLO\n"
            f"m = YOLO(r'{pt}')\nx = torch.load(r'{tmp_path / 'x.pt'}')\n"
            "m.model.eval(); y = m.model(x)\ny = y[0] if isinstance(y, (list, tuple)) else y\n"
            "print(json.dumps({'names': m.names, 'sum': float(y.double().sum()), 'shape': list(y.shape)}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "YOLO_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["names"] == {"0": "text", "1": "title", "2": "list"}
    from ultralytics import YOLO
    here = YOLO(str(pt)).model.eval()
    with torch.no_grad():
        y = here(x)
    y = y[0] if isinstance(y, (list, tuple)) else y
    assert res["shape"] == list(y.shape)
    assert res["sum"] == pytest.approx(float(y.double().sum()), rel=1e-5)


def test_importing_detect_keeps_pil_open_offline(tmp_path):
    """Ultralytics patches PIL.Image.open to pip-install pi-heif on unreadable images; we undo it."""
    import PIL.Image
    import pytest

    import gsdistill.detect  # noqa: F401
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    with pytest.raises(PIL.UnidentifiedImageError):
        PIL.Image.open(broken)


def test_detector_backbone_sees_the_pretraining_normalisation(backbone_dir):
    """Ultralytics feeds image/255; the ViT must get exactly what pretraining fed it (ImageNet mean/std)."""
    import numpy as np

    from gsdistill.models.view_batch import normalize_crops
    from gsdistill.tuples.sources.synthetic import generate_pages

    page = np.array(next(iter(generate_pages(1, seed=5, width=240, height=208)))["image"].convert("RGB"))
    pixels = torch.from_numpy(page).permute(2, 0, 1)[None].contiguous()
    x255 = pixels.float() / 255  # what Ultralytics' preprocess gives
    normalised = normalize_crops(pixels)[0].permute(1, 2, 0).numpy()  # pretraining's: uint8 crops normalised on the device
    det = build_detector(backbone_dir, nc=2, cfg=_cfg())
    exported = load_backbone(backbone_dir).eval()
    with torch.no_grad():
        got = det.model.model[0](x255)
        tokens = exported.forward_features(torch.from_numpy(normalised).permute(2, 0, 1)[None])
    want = tokens[:, exported.num_prefix_tokens:].reshape(1, 208 // 16, 240 // 16, -1).permute(0, 3, 1, 2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # and the difference is not negligible: unnormalised input gives other features
        raw = exported.forward_features(x255)[:, exported.num_prefix_tokens:]
    assert (raw - tokens[:, exported.num_prefix_tokens:]).norm() > 0.1 * tokens.norm()
