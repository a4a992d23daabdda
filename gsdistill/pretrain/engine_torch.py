"""Plain PyTorch engine: AdamW, optional DistributedDataParallel (torchrun), clipping, EMA teacher.

Both engines (this one and :mod:`gsdistill.pretrain.engine_deepspeed`) offer the same small surface
the loop uses: ``forward(batch) -> terms``, ``backward_step(total, lr) -> grad_norm``,
``weight_norm()``, ``update_teacher(momentum)``, ``save(folder, rank)``, ``load(folder)``,
``model_state()``, ``module``.
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


def build_adamw(groups: list[dict], optim_cfg) -> torch.optim.AdamW:
    return torch.optim.AdamW(groups, lr=float(optim_cfg["lr"]), betas=tuple(optim_cfg["betas"]),
                             eps=float(optim_cfg["eps"]))


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
        self.optimizer = build_adamw(param_groups(model, float(cfg["optim"]["weight_decay"])), cfg["optim"])
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.wrapped: nn.Module = model
        if world_size > 1:
            from torch.nn.parallel import DistributedDataParallel
            # buffers (text queues, DINO centres) evolve identically on every rank: no broadcast
            self.wrapped = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        self.module.train()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            return self.wrapped(batch)

    def backward_step(self, total: torch.Tensor, lr: float) -> float:
        """Backward, clip, AdamW step at learning rate ``lr``; return the pre-clip global grad norm."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        with record_function("gsdistill.backward"):
            total.backward()
        with record_function("gsdistill.optimizer"):
            max_norm = self.clip if self.clip > 0 else math.inf
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
            self.optimizer.step()
        return float(norm)

    @torch.no_grad()
    def weight_norm(self) -> float:
        """Global L2 norm of the trained student weights (identical on every DDP rank)."""
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.float()) for p in self.params])))

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
