"""Ultralytics model layers that put a (frozen) timm ViT under a YOLOv10 detect head.

Layer plan of the generated model YAML (see :func:`detector_yaml`)::

    0  ViTBackbone            /255 image -> ImageNet mean/std -> last-block tokens as a stride-16 map
                              [B, C, H/16, W/16]
    1  SimpleFeaturePyramid   stride-16 map -> [P3 (s8), P4 (s16), P5 (s32)], c_out channels each
    2-4 Index                 pick P3 / P4 / P5 out of the list (parse_model needs one tensor per layer)
    5  v10Detect              YOLOv10's NMS-free head (one-to-many + one-to-one branches)

The pyramid follows ViTDet (Li et al. 2022, "simple feature pyramid"): every level is built from the
last ViT block alone, by a stride-2 transposed convolution (s8), identity (s16) or max-pool (s32),
each followed by a 1x1 and a 3x3 convolution. Layer 0 is what ``freeze=[0]`` freezes.

Ultralytics' ``parse_model`` resolves layer names in ``ultralytics.nn.tasks``' namespace, so
importing this module registers the classes there; saved checkpoints pickle the classes under
``gsdistill.detect.modules``, so a new process that unpickles ``best.pt`` imports (and registers)
them too.
"""
from __future__ import annotations

import timm
import torch
from torch import nn
from ultralytics.nn import tasks as ul_tasks
from ultralytics.nn.modules import Conv

from gsdistill.views.pixels import IMAGENET_MEAN, IMAGENET_STD

BACKBONE_LAYER = 0  # index of the ViT layer in the generated YAML: the value given to freeze=
# Pretraining and retrieval normalise pages with ImageNet mean/std (gsdistill.views.pixels, the one
# definition); Ultralytics feeds the model image / 255. Python floats, not buffers: Ultralytics saves
# checkpoints in fp16, and a buffer would come back as the fp16 rounding of these constants.


class ViTBackbone(nn.Module):
    """A timm ViT returning its last block (final norm applied) as an NCHW map at the patch stride.

    Args:
        model_name: timm model name (``backbone.json``'s ``model_name``).
        kwargs: timm kwargs (``backbone.json``'s ``kwargs``); ``dynamic_img_size`` is forced on so
            the stride probe at 256 px and any multiple-of-32 training size work.
        frozen: when true the ViT stays in eval mode whatever ``.train()`` asks (no dropout,
            drop-path or norm-statistic updates) and runs without autograd. The weights themselves
            are frozen by Ultralytics' ``freeze=[0]``, which also keeps ``requires_grad`` off.
        normalize: the input is Ultralytics' ``image / 255`` (RGB, 0..1); the ViT sees
            ``(x - mean) / std`` with ImageNet's mean/std, exactly what it was pretrained on. Being
            part of the module, ``YOLO(best.pt)``, ``model.predict`` and an ONNX export all get it.
    """

    def __init__(self, model_name: str, kwargs: dict, frozen: bool = True, normalize: bool = True):
        super().__init__()
        kw = dict(kwargs)
        kw["dynamic_img_size"] = True
        self.frozen = bool(frozen)
        self.normalize = bool(normalize)
        self.vit = timm.create_model(model_name, pretrained=False, **kw)
        self.embed_dim = int(self.vit.embed_dim)
        self.patch_size = int(self.vit.patch_embed.patch_size[0])
        self.train(self.training)

    def train(self, mode: bool = True) -> "ViTBackbone":
        # Ultralytics calls model.train() every epoch; a frozen backbone must keep eval behaviour.
        super().train(mode and not self.frozen)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(f"ViTBackbone: input {h}x{w} is not a multiple of the patch size {self.patch_size}")
        # checkpoints written before the normalisation existed lack the attribute: they trained on /255
        if getattr(self, "normalize", False):
            mean = torch.tensor(IMAGENET_MEAN, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
            std = torch.tensor(IMAGENET_STD, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
            x = (x - mean) / std
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            feats = self.vit.forward_intermediates(x, indices=1, norm=True, output_fmt="NCHW",
                                                   intermediates_only=True)
        return feats[-1]


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid from one stride-``patch`` map to strides 8, 16 and 32.

    Args:
        c_in: ViT embedding width. c_out: channels of every output level.
        patch_size: stride of the input map (16 for the ViTs used here; 8 and 32 also supported).
        input_norm: standardise every channel of the frozen map first (BatchNorm without affine
            parameters, as MAE's linear probe does): frozen backbones differ in how their features are
            scaled, and a pretrained ViT can hold layout information in low-variance channels that a
            head trained for a few epochs would otherwise have to scale up itself.
    """

    def __init__(self, c_in: int, c_out: int, patch_size: int = 16, input_norm: bool = False):
        super().__init__()
        if patch_size not in (8, 16, 32):
            raise ValueError(f"SimpleFeaturePyramid: patch size {patch_size} must be 8, 16 or 32")
        self.input_norm = nn.BatchNorm2d(c_in, affine=False) if input_norm else None
        self.levels = nn.ModuleList(self._level(c_in, c_out, patch_size / s) for s in (8, 16, 32))

    @staticmethod
    def _level(c_in: int, c_out: int, scale: float) -> nn.Sequential:
        layers: list[nn.Module] = []
        c = c_in
        while scale > 1:  # upsample by 2 per step (ViTDet: ConvTranspose2d k=2 s=2)
            layers += [nn.ConvTranspose2d(c, c // 2, 2, 2), nn.GroupNorm(1, c // 2), nn.GELU()]
            c, scale = c // 2, scale / 2
        while scale < 1:  # downsample by 2 per step (ViTDet: max-pool k=2 s=2)
            layers.append(nn.MaxPool2d(2, 2))
            scale *= 2
        layers += [Conv(c, c_out, 1), Conv(c_out, c_out, 3)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        norm = getattr(self, "input_norm", None)  # detectors pickled before the option existed lack it
        if norm is not None:
            x = norm(x)
        return [level(x) for level in self.levels]


def register_modules() -> None:
    """Make the layers visible to ``parse_model`` (idempotent)."""
    for cls in (ViTBackbone, SimpleFeaturePyramid):
        setattr(ul_tasks, cls.__name__, cls)


register_modules()


def detector_yaml(model_name: str, kwargs: dict, embed_dim: int, patch_size: int, nc: int,
                  c_out: int = 128, frozen: bool = True, input_norm: bool = False) -> dict:
    """The Ultralytics model dict: ViT -> simple feature pyramid -> Index x3 -> v10Detect(nc)."""
    return {
        "nc": int(nc),
        "backbone": [
            [-1, 1, "ViTBackbone", [model_name, dict(kwargs), bool(frozen)]],
            [-1, 1, "SimpleFeaturePyramid", [int(embed_dim), int(c_out), int(patch_size), bool(input_norm)]],
            [1, 1, "Index", [int(c_out), 0]],
            [1, 1, "Index", [int(c_out), 1]],
            [1, 1, "Index", [int(c_out), 2]],
        ],
        "head": [[[2, 3, 4], 1, "v10Detect", ["nc"]]],
    }
