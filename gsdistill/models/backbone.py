"""The vision backbone: any timm ViT by name, saved as a standalone artefact.

An exported backbone is a folder with ``backbone.safetensors`` (the timm model's state dict) and
``backbone.json`` (``{"format": "gsdistill-backbone/1", "model_name": ..., "kwargs": {...}}``). Both
detection and retrieval load it with :func:`load_backbone`; timm alone can build it too::

    timm.create_model(meta["model_name"], pretrained=True,
                      pretrained_cfg_overlay={"file": "backbone.safetensors"}, **meta["kwargs"])
"""
from __future__ import annotations

import json
from pathlib import Path

import timm
import torch
from safetensors.torch import load_file, save_file

from gsdistill.errors import CorruptFileError, InputError, OutputWriteError, corrupt, writing_file

FORMAT = "gsdistill-backbone/1"
WEIGHTS, META = "backbone.safetensors", "backbone.json"


def backbone_kwargs(cfg: dict) -> dict:
    """timm kwargs of a backbone config ``{name, img_size, patch_size, embed_dim, depth, num_heads, ...}``.

    Keys set to ``None`` keep the timm default of ``name``. Dynamic image size is always on so the
    same weights take 224 px global views, 96 px local views and detector inputs of any size.
    """
    kw = {k: v for k, v in cfg.items() if k != "name" and v is not None}
    kw.setdefault("num_classes", 0)
    kw.setdefault("global_pool", "avg")  # mean over patch tokens = the page embedding h_p (Table A2)
    kw["dynamic_img_size"] = True
    return kw


class PatchProjection(torch.nn.Conv2d):
    """The ViT's stride = kernel patch convolution computed as a reshape and one matrix product.

    Same parameters and state-dict keys as the ``Conv2d`` it replaces, same result up to float
    rounding. Why: cuDNN runs the bf16 stride-16 convolution as an implicit GEMM that took 5 % of the
    compiled step on an H100 (docs/benchmarks.md), while the product is an ordinary tensor-core GEMM.
    The output is an NCHW *view* of an NHWC tensor, so timm's ``nchw_to(NHWC)`` / ``flatten(2).transpose``
    after it cost no copy. Anything the reshape cannot express (padding, overlap, a ragged edge)
    falls back to the convolution.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (kh, kw), (h_in, w_in) = self.kernel_size, x.shape[-2:]
        if (self.stride != self.kernel_size or self.padding != (0, 0) or self.dilation != (1, 1)
                or self.groups != 1 or h_in % kh or w_in % kw or x.dim() != 4):
            return super().forward(x)
        b, c = x.shape[:2]
        h, w = h_in // kh, w_in // kw
        cols = x.reshape(b, c, h, kh, w, kw).permute(0, 2, 4, 1, 3, 5).reshape(b, h, w, c * kh * kw)
        out = torch.nn.functional.linear(cols, self.weight.reshape(self.out_channels, -1), self.bias)
        return out.permute(0, 3, 1, 2)


def fast_patch_projection(model: torch.nn.Module) -> torch.nn.Module:
    """Turn the model's ``patch_embed.proj`` into a :class:`PatchProjection` in place (weights shared)."""
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    if type(proj) is torch.nn.Conv2d:
        proj.__class__ = PatchProjection  # same module, same parameters: only the forward changes
    return model


def create_backbone(cfg: dict) -> torch.nn.Module:
    """A randomly initialised timm ViT (vision backbones train from scratch: nothing is downloaded)."""
    name = cfg["name"]
    if not name.startswith(("vit_", "deit_", "eva", "beit")):
        raise ValueError(f"backbone '{name}' is not a timm ViT; use e.g. vit_tiny_patch16_224")
    try:
        return fast_patch_projection(timm.create_model(name, pretrained=False, **backbone_kwargs(cfg)))
    except RuntimeError as e:
        raise ValueError(f"timm has no model '{name}': {e}") from None


def non_finite_weights(state: dict[str, torch.Tensor]) -> list[str]:
    """The names of the float tensors of ``state`` holding NaN/inf."""
    return [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]


def save_backbone(model: torch.nn.Module, cfg: dict, out_dir: str | Path, extra: dict | None = None) -> Path:
    """Write ``backbone.safetensors`` + ``backbone.json`` into ``out_dir``; return the folder. A backbone
    with NaN/inf weights is refused before anything is written (every consumer would fail on it)."""
    out = Path(out_dir)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    bad = non_finite_weights(state)
    if bad:
        raise InputError(f"{out}: the backbone to write holds NaN/inf weights ({', '.join(bad[:3])}); not written")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "model_name": cfg["name"], "kwargs": backbone_kwargs(cfg),
            "embed_dim": int(getattr(model, "embed_dim", 0)), **(extra or {})}
    # both files written beside under temporary names, then renamed: a full disk leaves the backbone
    # that was there (or none), never a half-written one, and no folder this call made
    tmps = {name: out / (name + ".tmp") for name in (WEIGHTS, META)}
    try:
        with writing_file(out / WEIGHTS):
            save_file(state, str(tmps[WEIGHTS]))
        with writing_file(out / META):
            tmps[META].write_text(json.dumps(meta, indent=2))
    except OutputWriteError:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
        if made:
            _remove_if_empty(out)
        raise
    for name, tmp in tmps.items():
        tmp.replace(out / name)
    return out


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # it holds something now
        pass


def read_backbone_meta(path: str | Path) -> dict:
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    meta_path = folder / META
    if not meta_path.is_file():
        raise FileNotFoundError(f"{folder}: no {META}; is this an exported backbone folder?")
    try:
        meta = json.loads(meta_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise corrupt(meta_path, e, "JSON") from None
    if not isinstance(meta, dict):
        raise CorruptFileError(f"{meta_path}: not a backbone description (a JSON object with format, "
                               "model_name and kwargs)")
    if meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def load_backbone(path: str | Path, map_location: str = "cpu") -> torch.nn.Module:
    """Rebuild an exported backbone; a weight file of the wrong shape is a clear error."""
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    meta = read_backbone_meta(folder)
    model = timm.create_model(meta["model_name"], pretrained=False, **meta["kwargs"])
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{folder}: missing {WEIGHTS}")
    try:
        state = load_file(str(weights), device=map_location)
    except Exception as e:  # safetensors' SafetensorError ("incomplete metadata") names no file
        from gsdistill.errors import corrupt
        raise corrupt(weights, e, "safetensors") from None
    own = model.state_dict()
    bad = [f"{k}: file {tuple(v.shape)} vs model {tuple(own[k].shape)}"
           for k, v in state.items() if k in own and own[k].shape != v.shape]
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if bad or missing or unexpected:
        raise ValueError(f"{weights}: does not fit {meta['model_name']} {meta['kwargs']}: "
                         f"shape mismatches {bad[:5]}, missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.load_state_dict(state)
    return fast_patch_projection(model)
