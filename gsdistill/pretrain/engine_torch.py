"""Plain PyTorch engine: AdamW (torch's fused kernel where supported), optional
DistributedDataParallel (torchrun), clipping, EMA teacher.

Both engines (this one and :mod:`gsdistill.pretrain.engine_deepspeed`) offer the same small surface
the loop uses: ``forward(batch) -> terms``, ``backward_step(total, lr) -> grad_norm``,
``weight_norm()``, ``update_teacher(momentum)``, ``save(folder, rank)``, ``load(folder)``,
``model_state()``, ``module``. Here both norms are 0-dim tensors on the device: the loop reads
them back together, in its one host sync after the update.

``train.compile``: ``torch.compile`` of the step's forward (backward is compiled with it by
AOTAutograd), in place (parameter names and checkpoints are unchanged). ``train.compile_scope``
chooses what (:mod:`gsdistill.pretrain.step_compile`): the whole forward as ONE graph (``step``), or
each ViT block, traced once and reused by the others (``blocks``: PyTorch's regional compilation, a
third of the compile time on the CPU, less gained a step); ``train.compile_mode`` how (CUDA graphs with
``reduce-overhead``); ``train.compile_cache`` where inductor keeps its kernels between runs. The
ViT's iBOT-masking and token hooks are installed once, so nothing breaks the graph. The run's batch
streams give every batch one shape (``gsdistill.views.fixed_shapes``: texts, boxes, masked views and
iBOT rows padded to bounds set at the start, with validity flags), so the graph is compiled once for
static shapes. Static, not dynamic (symbolic): a symbolic graph still recompiled for every size left
unmarked (the span rows of ``sem_emb`` at step 4 of an H200 run, 85.8 s), its kernels carry size
arithmetic and guards, and CUDA graphs need static shapes. Only a batch whose iBOT indices are not
padded (a tool's or a test's own, without ``mask_valid``) still has them marked dynamic, as before, so
new maskings reuse one symbolic graph. With ``objective.teacher_temp_warmup_steps > 0`` the host-side schedule
splits it in pieces. A step with the losses' value checks on (the loop's first) runs eager, so the
run compiles once. The default, ``auto``, compiles a run long enough to earn the compile back, per
device, from the measured compile time (cold, or warm when this machine compiled the same step before)
and the seconds it saves a step (:data:`COMPILE_COST`, :func:`compile_min_steps`; docs/gpu.md, "Compile
settings"): on CUDA from 1,300 steps (500 warm), on the CPU from 3,100 (300 warm). Under ``auto`` a compile that
fails (no working C++ compiler or Python headers on the CPU, no Triton on the GPU) is reported and the
run goes on eager; ``true`` makes it an error.
"""
from __future__ import annotations

import math
import shutil
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function

from gsdistill.errors import InputError
from gsdistill.losses.precision import tf32_for_float32_islands
from gsdistill.losses.validation import checks_enabled
from gsdistill.pretrain import checkpoint
from gsdistill.pretrain.data_stream import HOST_INDICES
from gsdistill.pretrain.step_compile import (CUDAGRAPH_MODES, compile_mode, compile_scope, compile_step,
                                             compiled_before, remember_compiled, use_compile_cache)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Trainable student parameters in two AdamW groups: decayed matrices, undecayed rest.

    No decay on biases, norms, the ViT's position embedding / class token, the mask token and the
    logit scales (decaying a temperature or a position table has no regularising meaning).
    """
    no_decay_names = {f"backbone.{n}" for n in getattr(model.backbone, "no_weight_decay", set)()}
    decay, other = [], []
    for name, p in model.student_parameters():
        if not p.requires_grad:
            continue
        skip = p.ndim <= 1 or name in no_decay_names or name == "mask_token" or name.endswith("log_scale")
        (other if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


def build_adamw(groups: list[dict], optim_cfg, fused: bool = False) -> torch.optim.AdamW:
    """AdamW from ``optim.*``; ``fused``: torch's fused kernel (~3x faster than the per-tensor loop
    on the CPU, tools/bench/bench_pretrain.py's "optimizer" line), the plain one where it is unsupported."""
    kwargs = dict(lr=float(optim_cfg["lr"]), betas=tuple(optim_cfg["betas"]), eps=float(optim_cfg["eps"]))
    if fused:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, TypeError):
            pass
    return torch.optim.AdamW(groups, **kwargs)


# What compiling the whole step (the default scope) costs and saves, measured: (cold compile s, warm compile
# s, seconds saved a step); a run earns its compile back after compile / saved steps. CUDA: gpu_vit_s16 at
# batch 128: cold 91.6 s (an H200, issue 57's run), warm 35 s (an H100, the third lease), the step 0.093 s
# compiled against 0.166 s eager (the H200). CPU: the demo recipe (ViT-Tiny, 4 blocks, batch 16), one
# thread, CPU seconds with the C++ compiler's, medians of 3 runs (docs/benchmarks.md, "Compile in seconds"):
# cold 84.1 s, warm 8.2 s, 0.028 s saved of a 0.38 s step. Cold: an empty cache folder; warm: this machine
# compiled the same step into it before (step_compile.compiled_before). The regional scope compiles in a
# third of the time but saves a fourth as much a step on the CPU: its cold break-even is later (4,100).
COMPILE_COST = {"cuda": (91.6, 35.0, 0.073), "cpu": (84.1, 8.2, 0.028)}
CXX_COMPILERS = ("g++", "c++", "clang++")  # inductor writes and builds C++ kernels for the CPU


def compile_min_steps(device_type: str, warm: bool = False) -> int:
    """The shortest run ``train.compile: auto`` compiles on ``device_type``: compile seconds over seconds
    saved a step, rounded up to a hundred (CUDA 1,300 cold, 500 warm; the CPU 3,100 cold, 300 warm)."""
    cold, warm_s, saved = COMPILE_COST[device_type]
    return math.ceil((warm_s if warm else cold) / saved / 100) * 100


def compile_wanted(cfg, device: torch.device, world_size: int = 1) -> bool:
    """``train.compile``: true / false as given; ``auto``: on for one process (one CUDA device, or the
    CPU where a C++ compiler is installed) and a run of at least :func:`compile_min_steps` steps, warm
    when the cache folder holds this step already; off otherwise (several processes, where the compiled
    step has not been measured)."""
    setting = cfg["train"].get("compile", "auto")
    if setting != "auto":
        return bool(setting)
    if world_size != 1 or device.type not in COMPILE_COST:
        return False
    if device.type == "cpu" and not any(shutil.which(c) for c in CXX_COMPILERS):
        return False
    return int(cfg["optim"]["steps"]) >= compile_min_steps(device.type, warm=compiled_before(cfg, device))


class TorchEngine:
    """Single process or DDP (gloo on CPU, nccl on CUDA) around a GSDistill model."""

    cudagraphs = False  # the compiled code replays CUDA graphs (train.compile_mode): each step marks its start
    _remember = None

    def __init__(self, model: nn.Module, cfg, device: torch.device, world_size: int = 1):
        self.module = model.to(device)
        self.device = device
        self.clip = float(cfg["optim"]["clip_grad"])
        precision = str(cfg["train"]["precision"])
        if precision not in ("fp32", "bf16"):
            raise InputError(f"train.precision must be fp32 or bf16, got {precision!r}")
        self.autocast = precision == "bf16"  # weights and optimizer stay fp32; matmuls run in bf16
        self.optimizer = build_adamw(param_groups(model, float(cfg["optim"]["weight_decay"])), cfg["optim"], fused=True)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.wrapped: nn.Module = model
        self._skipped: torch.Tensor | None = None  # 1.0 on the device when the last update was skipped
        if self.autocast:
            tf32_for_float32_islands(device)
        self.compiled = compile_wanted(cfg, device, world_size)
        self.compile_optional = cfg["train"].get("compile", "auto") == "auto"  # a failed compile falls back
        self.compile_failed = False
        self._remember = None  # notes in the cache folder that this step compiled, after its first compiled call
        if self.compiled:
            mode = compile_mode(cfg, device, say=True)
            self.cudagraphs = mode in CUDAGRAPH_MODES
            warm = compiled_before(cfg, device)
            folder = use_compile_cache(cfg["train"].get("compile_cache", "auto"))
            compile_step(model, scope=compile_scope(cfg), mode=mode)
            print(f"[pretrain] train.compile: the {compile_scope(cfg)} scope, mode {mode}, compiled at the first "
                  f"unchecked step; inductor's cache {folder or 'off'}"
                  f"{' (this step compiled into it before: a warm compile)' if warm else ''}",
                  file=sys.stderr, flush=True)
            self._remember = lambda: remember_compiled(cfg, device)
        if world_size > 1:
            from torch.nn.parallel import DistributedDataParallel
            # buffers (text queues, DINO centres) evolve identically on every rank: no broadcast
            self.wrapped = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        self.module.train()
        if self.compiled and "mask_valid" not in batch:  # unpadded: a new masking changes these lengths
            from torch._dynamo import maybe_mark_dynamic

            for key in HOST_INDICES:
                if isinstance(batch.get(key), torch.Tensor):
                    maybe_mark_dynamic(batch[key], 0)
        # the checked step (the first; every step with train.debug_checks) runs eager: its value checks
        # read tensors on the host, which broke the graph, and the next step compiled anew
        eager = self.compile_failed or (self.compiled and checks_enabled())
        try:
            terms = self._call(batch, force_eager=eager)
        except torch._dynamo.exc.BackendCompilerFailed as e:  # raised before the graph ran: state intact
            if not self.compile_optional:
                raise
            self._report_failed_compile(e)
            return self._call(batch, force_eager=True)
        if not eager and self._remember is not None:  # compiled: a second run may count on a warm cache
            self._remember()
            self._remember = None
        return terms

    def _call(self, batch: dict, force_eager: bool) -> dict[str, torch.Tensor]:
        eager = torch.compiler.set_stance("force_eager") if force_eager else nullcontext()
        if self.cudagraphs and not force_eager:
            # a new step: the graphs may overwrite the last step's outputs, which nothing reads now
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast), eager:
            terms = self.wrapped(batch)
        if self.cudagraphs and not force_eager:  # a caller may keep them past the next step's replay,
            terms = {k: v.clone() for k, v in terms.items()}  # which writes over the graphs' outputs
        return terms

    def _report_failed_compile(self, error: Exception) -> None:
        reason = str(error).strip().splitlines()[0][:300]
        print(f"[pretrain] train.compile=auto: compiling the step failed ({type(error).__name__}: {reason}); "
              "training on eager (train.compile=false skips the attempt, true makes it an error)",
              file=sys.stderr, flush=True)
        self.compiled, self.compile_failed = False, True  # every later step runs eager (forward's stance)

    @property
    def guards_on_device(self) -> bool:
        """True with torch's fused AdamW: a step whose gradient norm is not finite is skipped by the
        kernel itself (its ``found_inf`` input, as GradScaler uses it), so the loop needs no host sync
        between forward and backward. The per-tensor AdamW has no such input."""
        return bool(self.optimizer.defaults.get("fused"))

    def backward_step(self, total: torch.Tensor, lr: float) -> torch.Tensor:
        """Backward, clip, AdamW step at learning rate ``lr``; return the pre-clip global grad norm
        (a 0-dim tensor: reading it is the caller's host sync). With :attr:`guards_on_device` a
        non-finite norm skips the update (weights, moments and step count unchanged) and the next
        :meth:`update_teacher`, with no host sync."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        with record_function("gsdistill.backward"):
            total.backward()
        with record_function("gsdistill.optimizer"):
            max_norm = self.clip if self.clip > 0 else math.inf
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
            if self.guards_on_device:
                self._skipped = (~torch.isfinite(norm)).to(torch.float32)
                self.optimizer.found_inf = self._skipped
            self.optimizer.step()
        return norm.detach()

    @torch.no_grad()
    def weight_norm(self) -> torch.Tensor:
        """Global L2 norm of the trained student weights, 0-dim tensor (identical on every DDP rank)."""
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.float() for p in self.params])))

    def update_teacher(self, momentum: float) -> None:
        """EMA teacher update; skipped on the device with the optimizer step it follows."""
        with record_function("gsdistill.ema"):
            self.module.update_teacher(momentum, skip=self._skipped)

    def model_state(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def save(self, folder: Path, rank: int) -> None:
        """Rank 0 writes weights and optimizer state (identical on every rank under DDP)."""
        if rank == 0:
            checkpoint.write_model(folder, self.model_state())
            checkpoint.save_torch(self.optimizer.state_dict(), Path(folder) / checkpoint.OPTIM_FILE)

    def load(self, folder: Path) -> None:
        checkpoint.load_model_state(self.module, checkpoint.read_model(folder, self.device),
                                    Path(folder) / checkpoint.MODEL_FILE)
        self.optimizer.load_state_dict(checkpoint.read_optimizer(folder))
