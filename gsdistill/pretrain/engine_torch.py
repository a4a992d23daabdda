"""Plain PyTorch engine: AdamW (torch's fused kernel where supported), optional
DistributedDataParallel (torchrun), clipping, EMA teacher.

Both engines (this one and :mod:`gsdistill.pretrain.engine_deepspeed`) offer the same small surface
the loop uses: ``forward(batch) -> terms``, ``backward_step(total, lr) -> grad_norm``,
``weight_norm()``, ``update_teacher(momentum)``, ``save(folder, rank)``, ``load(folder)``,
``model_state()``, ``module``. Here both norms are 0-dim tensors on the device: the loop reads
them back together, in its one host sync after the update.

``train.compile``: ``torch.compile`` of the transformer blocks (student and teacher) and of every
head, in place (``nn.Module.compile``: parameter names and checkpoints are unchanged). The
backbone's own forward stays eager: it carries the temporary iBOT-masking and token hooks of
``gsdistill.models.vit_encoder``, which would force a recompile per call. Off by default until it
measures faster (``tools/bench_pretrain.py`` times eager and compiled steps side by side).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function

from gsdistill.errors import InputError
from gsdistill.pretrain import checkpoint


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


def compile_parts(model: nn.Module) -> list[str]:
    """Compile (lazily, in place) the blocks and heads named in the module docstring; their names."""
    names = []
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        in_blocks = name.rsplit(".", 1)[0].endswith("blocks") and last.isdigit()
        if (in_blocks or last in ("dino_head", "ibot_head", "head", "text_proj")) and not isinstance(module, nn.Identity):
            module.compile()
            names.append(name)
    return names


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
        self.compiled = compile_parts(model) if bool(cfg["train"].get("compile", False)) else []
        if world_size > 1:
            from torch.nn.parallel import DistributedDataParallel
            # buffers (text queues, DINO centres) evolve identically on every rank: no broadcast
            self.wrapped = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        self.module.train()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            return self.wrapped(batch)

    def backward_step(self, total: torch.Tensor, lr: float) -> torch.Tensor:
        """Backward, clip, AdamW step at learning rate ``lr``; return the pre-clip global grad norm
        (a 0-dim tensor: reading it is the caller's host sync)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        with record_function("gsdistill.backward"):
            total.backward()
        with record_function("gsdistill.optimizer"):
            max_norm = self.clip if self.clip > 0 else math.inf
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
            self.optimizer.step()
        return norm.detach()

    @torch.no_grad()
    def weight_norm(self) -> torch.Tensor:
        """Global L2 norm of the trained student weights, 0-dim tensor (identical on every DDP rank)."""
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.float() for p in self.params])))

    def update_teacher(self, momentum: float) -> None:
        with record_function("gsdistill.ema"):
            self.module.update_teacher(momentum)

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
