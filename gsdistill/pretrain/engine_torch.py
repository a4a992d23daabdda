"""Plain PyTorch engine: AdamW (torch's fused kernel where supported), optional
DistributedDataParallel (torchrun), clipping, EMA teacher.

Both engines (this one and :mod:`gsdistill.pretrain.engine_deepspeed`) offer the same small surface
the loop uses: ``forward(batch) -> terms``, ``backward_step(total, lr) -> grad_norm``,
``weight_norm()``, ``update_teacher(momentum)``, ``save(folder, rank)``, ``load(folder)``,
``model_state()``, ``module``. Here both norms are 0-dim tensors on the device: the loop reads
them back together, in its one host sync after the update.

``train.compile``: ``torch.compile`` of the whole forward of the step (student and teacher backbones,
every head, every loss term and the teacher targets) as ONE graph (``nn.Module.compile`` in place:
parameter names and checkpoints are unchanged; backward is compiled with it by AOTAutograd). The
ViT's iBOT-masking and token hooks are installed once, so nothing breaks the graph. The run's batch
streams give every batch one shape (``gsdistill.views.fixed_shapes``: texts, boxes, masked views and
iBOT rows padded to bounds set at the start, with validity flags), so the graph is compiled once for
static shapes. Static, not dynamic (symbolic): a symbolic graph still recompiled for every size left
unmarked (the span rows of ``sem_emb`` at step 4 of an H200 run, 85.8 s), its kernels carry size
arithmetic and guards, and CUDA graphs need static shapes. Only a batch whose iBOT indices are not
padded (a tool's or a test's own, without ``mask_valid``) still has them marked dynamic, as before, so
new maskings reuse one symbolic graph. With ``objective.teacher_temp_warmup_steps > 0`` the host-side schedule
splits it in pieces. A step with the losses' value checks on (the loop's first) runs eager, so the
run compiles once. The default, ``auto``, was chosen per device by measurement
(:func:`compile_wanted`; docs/benchmarks.md, "GPU" and "Pretraining step"): on one H100 the compiled
step of ``gpu_vit_s16`` took 0.52x (batch 64) and 0.60x (batch 128) of the eager one after 110-130 s
of compiling; on the CPU (the real-page recipe, 16 pages, one thread) 0.85x after 135 s of compiling
with a cold cache. Both earn the compile back after about 1,500 steps. Under ``auto`` a compile that
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
    on the CPU, tools/bench_pretrain.py's "optimizer" line), the plain one where it is unsupported."""
    kwargs = dict(lr=float(optim_cfg["lr"]), betas=tuple(optim_cfg["betas"]), eps=float(optim_cfg["eps"]))
    if fused:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, TypeError):
            pass
    return torch.optim.AdamW(groups, **kwargs)


# runs shorter than this do not earn back the compile: on an H100 it took 110-130 s and saves 0.07-0.09 s
# a step at gpu_vit_s16 (docs/benchmarks.md, "GPU"); on the CPU 135 s (cold cache) and 0.09 s a step of
# the real-page recipe at 16 pages on one thread, 0.85x of eager (docs/benchmarks.md, "The packed step")
COMPILE_MIN_STEPS = 1500
CXX_COMPILERS = ("g++", "c++", "clang++")  # inductor writes and builds C++ kernels for the CPU


def compile_wanted(cfg, device: torch.device, world_size: int = 1) -> bool:
    """``train.compile``: true / false as given; ``auto``: on for one process (one CUDA device, or the
    CPU where a C++ compiler is installed) and a run of at least :data:`COMPILE_MIN_STEPS` steps, off
    otherwise (several processes, where the compiled step has not been measured)."""
    setting = cfg["train"].get("compile", "auto")
    if setting == "auto":
        if world_size != 1 or int(cfg["optim"]["steps"]) < COMPILE_MIN_STEPS:
            return False
        if device.type == "cpu":
            return any(shutil.which(c) for c in CXX_COMPILERS)
        return device.type == "cuda"
    return bool(setting)


def compile_step(model: nn.Module, backend="inductor") -> None:
    """Compile ``model``'s forward in place (see the module docstring); ``backend``: ``aot_eager``
    in tests (the same graph capture and autograd, no code generation)."""
    model.compile(backend=backend)


class TorchEngine:
    """Single process or DDP (gloo on CPU, nccl on CUDA) around a GSDistill model."""

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
        if self.compiled:
            compile_step(model)
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
        try:
            return self._call(batch, force_eager=self.compile_failed or (self.compiled and checks_enabled()))
        except torch._dynamo.exc.BackendCompilerFailed as e:  # raised before the graph ran: state intact
            if not self.compile_optional:
                raise
            self._report_failed_compile(e)
            return self._call(batch, force_eager=True)

    def _call(self, batch: dict, force_eager: bool) -> dict[str, torch.Tensor]:
        eager = torch.compiler.set_stance("force_eager") if force_eager else nullcontext()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast), eager:
            return self.wrapped(batch)

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
            torch.save(self.optimizer.state_dict(), Path(folder) / checkpoint.OPTIM_FILE)

    def load(self, folder: Path) -> None:
        checkpoint.load_model_state(self.module, checkpoint.read_model(folder, self.device),
                                    Path(folder) / checkpoint.MODEL_FILE)
        self.optimizer.load_state_dict(checkpoint.read_optimizer(folder))
