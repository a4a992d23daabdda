"""How the torch engine compiles the training step (``train.compile``, whether, is decided in
:func:`gsdistill.pretrain.engine_torch.compile_wanted`): ``train.compile_scope`` (what),
``train.compile_mode`` (how) and ``train.compile_cache`` (where the compiler keeps what it built).

Scopes (docs/benchmarks.md, "Compile in seconds"):

- ``step``: the whole forward of the step (student and teacher backbones, every head, every loss
  term and the teacher targets) as ONE graph; backward is compiled with it by AOTAutograd.
- ``blocks``: PyTorch's regional compilation: each transformer block of every timm ViT in the model
  (student and teacher) is compiled on its own; they share one code object, so dynamo traces ONE
  block per call shape and grad mode (student global / local views, teacher global / local) and the
  other ``depth - 1`` blocks reuse that code. Everything else runs eager.

Measured on the CPU (one thread, 3 runs each; docs/benchmarks.md, "Compile in seconds"): ``blocks``
compiles in 0.27-0.48x the step's time cold (the CPU demo recipe: 31 s against 84 s) and 0.12-0.29x
warm (1.7 s against 8.2 s), but its step is 0.97-0.99x eager where the whole step's is 0.92-0.93x:
most of what compiling gains there is the heads' and losses' fused element-wise work, which ``blocks``
leaves eager. So a run long enough for ``auto`` to compile (3,100 steps cold on the CPU) finishes
sooner with ``step``; ``blocks`` is for a run where the first fast step matters more than the rest (a
short run with ``train.compile=true``). On a GPU the two are still to be compared (docs/gpu.md).

Both compile in place (``nn.Module.compile``): parameter names and checkpoints are unchanged.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

SCOPES = ("step", "blocks")
# modes that capture CUDA graphs, and what each is without them (CUDA graphs exist only on CUDA)
CUDAGRAPH_MODES = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
MODES = ("default", "max-autotune-no-cudagraphs", *CUDAGRAPH_MODES)


def compile_scope(cfg) -> str:
    """``train.compile_scope``: ``step`` (the default: on the CPU it earns its compile back sooner than
    ``blocks``, whose step keeps the heads and losses eager) or ``blocks``."""
    scope = str(cfg["train"].get("compile_scope", "step"))
    if scope not in SCOPES:
        raise ValueError(f"train.compile_scope must be step or blocks, got {scope!r}")
    return scope


def compile_mode(cfg, device: torch.device, say: bool = False) -> str:
    """``train.compile_mode`` for ``device``: a mode that captures CUDA graphs becomes the same mode
    without them off CUDA (inductor would skip the graphs for CPU tensors anyway); ``say``: on stderr."""
    mode = str(cfg["train"].get("compile_mode", "default"))
    if mode not in MODES:
        raise ValueError(f"train.compile_mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode in CUDAGRAPH_MODES and device.type != "cuda":
        fallback = CUDAGRAPH_MODES[mode]
        if say:
            print(f"[pretrain] train.compile_mode={mode}: CUDA graphs need a CUDA device; compiling with "
                  f"mode={fallback} on {device.type}", file=sys.stderr, flush=True)
        return fallback
    return mode


LEDGER = "gsdistill-compiled.json"  # in the cache folder: the steps compiled into it


def step_key(cfg, device: torch.device) -> str:
    """What makes a step's compiled code: torch, the device, scope and mode, the model, objective, views,
    batch and precision (a second run with the same key finds its kernels in the cache folder)."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    name = torch.cuda.get_device_name(device) if device.type == "cuda" and torch.cuda.is_available() else device.type
    what = [torch.__version__, name, compile_scope(cfg), compile_mode(cfg, device),
            {k: plain.get(k) for k in ("model", "objective", "views")},
            plain["optim"]["batch_size"], plain["train"].get("precision")]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:20]


def compiled_before(cfg, device: torch.device) -> bool:
    """True when this machine's cache folder holds this step's compiled code (:func:`remember_compiled`)."""
    folder = cache_folder(cfg["train"].get("compile_cache", "auto"))
    try:
        return folder is not None and step_key(cfg, device) in json.loads((folder / LEDGER).read_text())
    except (OSError, ValueError):
        return False


def remember_compiled(cfg, device: torch.device) -> None:
    """Note in the cache folder that this step compiled into it (after its first compiled step)."""
    folder = cache_folder(cfg["train"].get("compile_cache", "auto"))
    if folder is None:
        return
    try:
        ledger = json.loads((folder / LEDGER).read_text())
    except (OSError, ValueError):
        ledger = {}
    ledger[step_key(cfg, device)] = time.strftime("%Y-%m-%dT%H:%M:%S")
    tmp = folder / f"{LEDGER}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(ledger, indent=1))
        tmp.replace(folder / LEDGER)  # atomic: two runs finishing together leave one whole file
    except OSError:  # a read-only or full cache folder costs the next run a cold compile, nothing more
        pass


def cache_folder(setting) -> Path | None:
    """The folder ``train.compile_cache`` names: ``auto`` = ``$TORCHINDUCTOR_CACHE_DIR`` when set, else
    ``$XDG_CACHE_HOME/gsdistill/inductor`` (``~/.cache/...``); ``false`` (YAML's ``off``) = None, no cache."""
    if setting is False or str(setting).lower() in ("off", "false"):
        return None
    setting = "auto" if setting in (None, True) else str(setting)
    if setting != "auto":
        return Path(setting).expanduser().resolve()
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gsdistill" / "inductor"


def use_compile_cache(setting) -> Path | None:
    """Point inductor's on-disk caches (FX graphs, AOTAutograd, kernels, autotuning) at
    :func:`cache_folder`, before the first compile; ``off`` disables them. torch's default, a folder
    under /tmp, is gone after a reboot or a job on many clusters; this one is kept, so a second run of
    the same step on the same machine loads its kernels instead of compiling them (warm vs cold
    compile in docs/benchmarks.md)."""
    import torch._inductor.config as inductor_config

    folder = cache_folder(setting)
    inductor_config.force_disable_caches = folder is None
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from gsdistill.config import ConfigError
        raise ConfigError(f"train.compile_cache={setting}: {folder} cannot be created "
                          f"({e.strerror or type(e).__name__}); give a folder you can write, auto or off") from None
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") != str(folder):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
        from torch._inductor.utils import clear_caches
        clear_caches()  # inductor memoises paths under the folder it saw first
    return folder  # the FX-graph and AOTAutograd caches are on by torch's default (and its env switches)


def vit_blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of every timm ViT inside ``model`` (the student's and the teacher's)."""
    from timm.models.vision_transformer import VisionTransformer

    return [block for m in model.modules() if isinstance(m, VisionTransformer) for block in m.blocks]


class BufferDropPath(nn.Module):
    """Stochastic depth (timm's ``DropPath``) with its rate in a buffer instead of a float attribute.

    dynamo guards a module's float attributes by value: the linearly rising rates of
    ``drop_path_rate > 0`` (gpu_vit_s16: 0.1) made each block a recompile of its own, and at 8 the
    blocks fell back to eager. A buffer (not saved: ``persistent=False``) is a graph input instead,
    so every block of a ViT shares one graph. Same distribution as timm's: each sample's residual
    branch is kept with probability ``1 - rate`` and scaled by ``1 / (1 - rate)`` in training.
    """

    def __init__(self, rate: float, device=None):
        super().__init__()
        self.register_buffer("keep", torch.tensor(1.0 - float(rate), device=device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        draw = torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), device=x.device, dtype=x.dtype)
        return x * ((draw < self.keep).to(x.dtype) / self.keep.to(x.dtype))


def share_drop_paths(blocks: list[nn.Module]) -> int:
    """Swap the blocks' stochastic-depth modules for :class:`BufferDropPath` when their rates differ
    (with one rate, e.g. all 0 as timm's ``Identity``, they already share a graph); returns how many."""
    names = [(b, n) for b in blocks for n in ("drop_path1", "drop_path2") if hasattr(b, n)]
    rates = {float(getattr(getattr(b, n), "drop_prob", 0.0)) for b, n in names}
    if len(rates) <= 1:
        return 0
    for block, name in names:
        old = getattr(block, name)
        device = next(block.parameters()).device
        setattr(block, name, BufferDropPath(getattr(old, "drop_prob", 0.0), device).train(old.training))
    return len(names)


def compile_step(model: nn.Module, backend="inductor", scope: str = "step", mode: str | None = None) -> int:
    """Compile ``model`` in place for ``scope`` (module docstring); returns the modules compiled.
    ``backend``: ``aot_eager`` in tests (the same graph capture and autograd, no code generation);
    ``mode``: torch.compile's, inductor only."""
    kwargs = {"backend": backend}
    if mode not in (None, "default"):
        kwargs["mode"] = mode
    if scope == "step":
        model.compile(**kwargs)
        return 1
    if scope != "blocks":
        raise ValueError(f"unknown compile scope {scope!r}")
    blocks = vit_blocks(model)
    if not blocks:
        raise ValueError("train.compile_scope=blocks: the model holds no timm ViT blocks")
    share_drop_paths(blocks)
    for block in blocks:
        # static: the run's batches have one shape (gsdistill.views.fixed_shapes), and a symbolic
        # graph would carry size guards and keep CUDA graphs from the step
        block.compile(dynamic=False, **kwargs)
    return len(blocks)
