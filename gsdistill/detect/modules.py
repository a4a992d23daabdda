"""Ultralytics model layers that put a (frozen) timm ViT under a YOLOv10 detect head.

Layer plan of the generated model YAML (see :func:`detector_yaml`)::

    0  ViTBackbone            /255 image -> ImageNet mean/std -> the tokens of the chosen blocks as
                              stride-16 maps, stacked on channels [B, k*C, H/16, W/16]
    1  SimpleFeaturePyramid   those maps -> [P3 (s8), P4 (s16), P5 (s32)], c_out channels each
    2-4 Index                 pick P3 / P4 / P5 out of the list (parse_model needs one tensor per layer)
    5  v10Detect              YOLOv10's NMS-free head (one-to-many + one-to-one branches)

With ``neck="pan"`` (``adapter_neck``) YOLOv10's own neck sits between the Index layers and
v10Detect, as in Ultralytics' ``yolov10n.yaml`` head section: top-down (upsample, concat, C2f) then
bottom-up (strided Conv / SCDown, concat, C2f / C2fCIB), P3 / P4 / P5 out at ``c``, ``2c`` and ``4c``
channels (``c = adapter_channels``; 64 gives the n-scale widths 64 / 128 / 256, one repeat each).
Paper 003 trains a 5.7M-parameter head on its frozen ViT; the pyramid + v10Detect alone hold 0.75M
at ``c = 64``, and the neck is what a YOLOv10 "head" has on top of its backbone.

The pyramid follows ViTDet (Li et al. 2022, "simple feature pyramid"): each level is built by a
stride-2 transposed convolution (s8), identity (s16) or max-pool (s32), then a 1x1 and a 3x3
convolution. What each level reads (``adapter_features``, :data:`FEATURES`):

- ``last``: the last block for every level (ViTDet);
- ``levels``: one block per level, shallower blocks for finer levels (P3 <- block d/2, P4 <- 3d/4,
  P5 <- d of a d-block ViT), the intermediate-block pyramid of ViT-Adapter / DPT;
- ``mix``: every block, mixed per level by learned softmax weights (ELMo's scalar mix; the head
  chooses how much of each depth it reads, starting from an even mix).

Every block map goes through the ViT's final norm. Layer 0 is what ``freeze=[0]`` freezes; the mix
weights live in layer 1 and train with the head.

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

from gsdistill.models.backbone import fast_patch_projection
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

    def __init__(self, model_name: str, kwargs: dict, frozen: bool = True, normalize: bool = True,
                 blocks: list[int] | None = None):
        super().__init__()
        kw = dict(kwargs)
        kw["dynamic_img_size"] = True
        self.frozen = bool(frozen)
        self.normalize = bool(normalize)
        self.vit = fast_patch_projection(timm.create_model(model_name, pretrained=False, **kw))
        self.embed_dim = int(self.vit.embed_dim)
        self.patch_size = int(self.vit.patch_embed.patch_size[0])
        depth = len(self.vit.blocks)
        self.blocks = [int(b) for b in (blocks or [depth])]  # 1-based block numbers, in output order
        bad = [b for b in self.blocks if not 1 <= b <= depth]
        if bad:
            raise ValueError(f"ViTBackbone: blocks {bad} out of range: {model_name} has blocks 1..{depth}")
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
            blocks = getattr(self, "blocks", None)  # detectors pickled before the option read the last block
            wanted = sorted({b - 1 for b in blocks}) if blocks else 1
            feats = self.vit.forward_intermediates(x, indices=wanted, norm=True, output_fmt="NCHW",
                                                   intermediates_only=True)
        if not blocks:
            return feats[-1]
        by_block = dict(zip(wanted, feats))
        return torch.cat([by_block[b - 1] for b in blocks], dim=1) if len(blocks) > 1 else by_block[blocks[0] - 1]


FEATURES = ("last", "levels", "mix")  # what each pyramid level reads (module doc)


def feature_blocks(features: str, depth: int) -> list[int]:
    """1-based ViT blocks the pyramid reads for ``features`` on a ``depth``-block ViT."""
    if features == "last":
        return [depth]
    if features == "levels":  # P3, P4, P5
        return [max(1, round(depth / 2)), max(1, round(3 * depth / 4)), depth]
    if features == "mix":
        return list(range(1, depth + 1))
    raise ValueError(f"adapter_features must be one of {FEATURES}, got {features!r}")


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid from stride-``patch`` block maps to strides 8, 16 and 32.

    Args:
        c_in: ViT embedding width (of ONE block map). c_out: channels of every output level.
        patch_size: stride of the input map (16 for the ViTs used here; 8 and 32 also supported).
        input_norm: standardise every channel of the frozen maps first (BatchNorm without affine
            parameters, as MAE's linear probe does): frozen backbones differ in how their features are
            scaled, and a pretrained ViT can hold layout information in low-variance channels that a
            head trained for a few epochs would otherwise have to scale up itself.
        features: ``last`` | ``levels`` | ``mix`` (module doc). n_blocks: block maps stacked on the
            input's channels (1 for ``last``, 3 for ``levels``, the ViT's depth for ``mix``).
    """

    def __init__(self, c_in: int, c_out: int, patch_size: int = 16, input_norm: bool = False,
                 features: str = "last", n_blocks: int = 1):
        super().__init__()
        if patch_size not in (8, 16, 32):
            raise ValueError(f"SimpleFeaturePyramid: patch size {patch_size} must be 8, 16 or 32")
        expected = {"last": 1, "levels": 3}.get(features, n_blocks)
        if features not in FEATURES or n_blocks != expected or n_blocks < 1:
            raise ValueError(f"SimpleFeaturePyramid: features={features!r} with {n_blocks} block maps "
                             f"(one of {FEATURES}; last reads 1 map, levels 3)")
        self.features, self.n_blocks = features, int(n_blocks)
        self.input_norm = nn.BatchNorm2d(c_in * n_blocks, affine=False) if input_norm else None
        # per level, logits over the blocks; zeros = an even mix at the start
        self.mix = nn.Parameter(torch.zeros(3, n_blocks)) if features == "mix" else None
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

    def level_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The map each of P3, P4, P5 reads (after the optional input norm)."""
        features = getattr(self, "features", "last")  # detectors pickled before the option read one map
        if features == "last":
            return [x, x, x]
        maps = x.chunk(self.n_blocks, dim=1)
        if features == "levels":
            return list(maps)
        weights = self.mix.float().softmax(dim=1).to(x.dtype)  # [3 levels, n_blocks]
        stacked = torch.stack(maps)  # [n_blocks, B, C, H, W]
        return list(torch.einsum("ln,nbchw->lbchw", weights, stacked).unbind(0))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        norm = getattr(self, "input_norm", None)  # detectors pickled before the option existed lack it
        if norm is not None:
            x = norm(x)
        return [level(inp) for level, inp in zip(self.levels, self.level_inputs(x))]


def register_modules() -> None:
    """Make the layers visible to ``parse_model`` (idempotent)."""
    for cls in (ViTBackbone, SimpleFeaturePyramid):
        setattr(ul_tasks, cls.__name__, cls)


register_modules()


NECKS = ("none", "pan")


def pan_neck(c: int) -> list[list]:
    """YOLOv10's PAN neck over layers 2 / 3 / 4 (P3 / P4 / P5 at stride 8 / 16 / 32), as layers 5-16 of
    the model; outputs at layers 10 (P3, ``c``), 13 (P4, ``2c``) and 16 (P5, ``4c``)."""
    return [
        [-1, 1, "nn.Upsample", [None, 2, "nearest"]],  # 5: P5 -> stride 16
        [[-1, 3], 1, "Concat", [1]],
        [-1, 1, "C2f", [2 * c]],                       # 7: top-down P4
        [-1, 1, "nn.Upsample", [None, 2, "nearest"]],
        [[-1, 2], 1, "Concat", [1]],
        [-1, 1, "C2f", [c]],                           # 10: P3 out
        [-1, 1, "Conv", [c, 3, 2]],
        [[-1, 7], 1, "Concat", [1]],
        [-1, 1, "C2f", [2 * c]],                       # 13: P4 out
        [-1, 1, "SCDown", [2 * c, 3, 2]],
        [[-1, 4], 1, "Concat", [1]],
        [-1, 1, "C2fCIB", [4 * c, True, True]],        # 16: P5 out
    ]


def detector_yaml(model_name: str, kwargs: dict, embed_dim: int, patch_size: int, nc: int,
                  c_out: int = 128, frozen: bool = True, input_norm: bool = False,
                  features: str = "last", depth: int | None = None, neck: str = "none") -> dict:
    """The Ultralytics model dict: ViT -> simple feature pyramid -> Index x3 (-> YOLOv10's PAN neck
    with ``neck="pan"``) -> v10Detect(nc). ``features`` (:data:`FEATURES`) needs the ViT's ``depth``
    unless it is ``last``."""
    if features != "last" and depth is None:
        raise ValueError(f"detector_yaml: adapter_features={features!r} needs the ViT's depth")
    if neck not in NECKS:
        raise ValueError(f"adapter_neck must be one of {NECKS}, got {neck!r}")
    blocks = feature_blocks(features, int(depth)) if features != "last" else None
    vit_args = [model_name, dict(kwargs), bool(frozen)] + ([True, blocks] if blocks else [])
    pyramid_args = [int(embed_dim), int(c_out), int(patch_size), bool(input_norm)]
    if blocks:
        pyramid_args += [features, len(blocks)]
    layers = pan_neck(int(c_out)) if neck == "pan" else []
    outputs = [10, 13, 16] if neck == "pan" else [2, 3, 4]
    return {
        "nc": int(nc),
        "backbone": [
            [-1, 1, "ViTBackbone", vit_args],
            [-1, 1, "SimpleFeaturePyramid", pyramid_args],
            [1, 1, "Index", [int(c_out), 0]],
            [1, 1, "Index", [int(c_out), 1]],
            [1, 1, "Index", [int(c_out), 2]],
        ],
        "head": [*layers, [outputs, 1, "v10Detect", ["nc"]]],
    }
