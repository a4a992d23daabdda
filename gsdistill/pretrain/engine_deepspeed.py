"""DeepSpeed engine: ZeRO with CPU offload as ``train.deepspeed_config`` names it (configs/deepspeed/).

Same surface as :class:`gsdistill.pretrain.engine_torch.TorchEngine`. The JSON file chooses the
ZeRO stage and what is offloaded; the trainer fills in the rest from the pretrain config, so the
file must not set them (:func:`load_ds_config`): the micro-batch, clipping, the optimizer and the
precision. The optimizer is AdamW with the same parameter groups and ``optim.*`` as the torch
engine: DeepSpeedCPUAdam where the optimizer is offloaded (the default, ZeRO-2 with only the
optimizer on the CPU, and the paper's ZeRO-3 configs), torch's AdamW otherwise. Both engines give the same losses on the same seed
(tested for every config in configs/deepspeed/).

What runs under ``train.precision: bf16`` is what the torch engine runs: fp32 weights, and the
forward under torch's bf16 autocast, here through DeepSpeed's own ``torch_autocast`` section (an
outer ``torch.autocast`` would be switched off inside DeepSpeed's forward). Autocast computes
matrix products and convolutions in bf16 and keeps softmax, norms and the losses in fp32 (on
CUDA their matrix products on TF32 tensor cores, as in the torch engine); the gradients are fp32
and are reduced in fp32 (``lower_precision_safe_modules`` is empty, as under DDP). So the
optimizer's fp32 masters, the module's fp32 weights and the EMA teacher are those of the torch
engine, and the EMA runs in place on the module's fp32 weights where they live
(:mod:`gsdistill.pretrain.teacher_fp32`). Checkpoints (``model.safetensors``) hold fp32 weights.
Measured on the CPU: the engines' bf16 terms are equal at step 1 and within the spread a one-ulp
change of the weights causes over 5 steps (``tests/test_gpu_engines.py``).

Needs ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (set by ``deepspeed``/``torchrun``, or
by the trainer for one process). The first ``deepspeed.initialize`` on a machine JIT-builds a
small communication op, and the first DeepSpeedCPUAdam its CPU Adam (~3 min on 2 busy CPU cores);
``TORCH_EXTENSIONS_DIR`` caches them.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from gsdistill.errors import CorruptFileError, InputError, MissingFileError, writing_file
from gsdistill.losses.precision import tf32_for_float32_islands
from gsdistill.pretrain import checkpoint
from gsdistill.pretrain.engine_torch import build_adamw, param_groups
from gsdistill.pretrain.teacher_fp32 import TeacherEMA, own_elements

DS_SUBDIR, DS_TAG = "deepspeed", "state"
# DeepSpeed config sections the pretrain config owns (train.precision, optim.*)
TRAINER_OWNED = ("bf16", "fp16", "torch_autocast", "optimizer", "scheduler")
# torch's bf16 autocast; gradients and gathered weights stay fp32 (no module listed), as under DDP
BF16_AUTOCAST = {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}


def load_ds_config(path: str | Path, cfg, micro_batch: int) -> dict:
    """The JSON config with the keys this trainer owns filled in from the pretrain config."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"train.deepspeed_config: deepspeed config not found: {path}")
    try:
        ds = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path}: not valid JSON ({e})") from None
    owned = [k for k in TRAINER_OWNED if k in ds]
    if owned:
        raise InputError(f"train.deepspeed_config: {path} sets {', '.join(owned)}, which the pretrain config "
                         "owns (train.precision, optim.*): remove them from the JSON")
    ds.pop("_comment", None)
    ds["train_micro_batch_size_per_gpu"] = int(micro_batch)
    ds["gradient_accumulation_steps"] = 1
    ds["gradient_clipping"] = float(cfg["optim"]["clip_grad"])
    ds["zero_allow_untested_optimizer"] = True  # torch's AdamW where the optimizer is not offloaded
    if cfg["train"]["precision"] == "bf16":
        ds["torch_autocast"] = dict(BF16_AUTOCAST)
    return ds


def offloads_optimizer(ds_config: dict) -> bool:
    device = ds_config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    return device in ("cpu", "nvme")


def build_optimizer(model: nn.Module, cfg, ds_config: dict) -> torch.optim.Optimizer:
    """AdamW over the torch engine's parameter groups: DeepSpeedCPUAdam where DeepSpeed keeps the
    optimizer on the CPU (vectorised C++, much faster than torch's loop there), torch's otherwise."""
    groups = param_groups(model, float(cfg["optim"]["weight_decay"]))
    if not offloads_optimizer(ds_config):
        return build_adamw(groups, cfg["optim"], fused=True)
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    o = cfg["optim"]
    return DeepSpeedCPUAdam(groups, lr=float(o["lr"]), betas=tuple(o["betas"]), eps=float(o["eps"]), adamw_mode=True)


class DeepSpeedEngine:
    def __init__(self, model: nn.Module, cfg, device: torch.device, world_size: int, micro_batch: int,
                 config_path: str | Path):
        import deepspeed

        self._ds = deepspeed
        self.module = model
        self.device = device
        ds_config = load_ds_config(config_path, cfg, micro_batch)
        if "torch_autocast" in ds_config:  # as the torch engine: the fp32 islands of bf16 autocast on TF32
            tf32_for_float32_islands(device)
        optimizer = build_optimizer(model, cfg, ds_config)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                                 config=ds_config)
        self.zero3 = ds_config.get("zero_optimization", {}).get("stage", 0) == 3
        self.teacher = TeacherEMA(model.teacher_pairs())
        names = {id(p): n for n, p in model.named_parameters()}
        self._teacher_names = [names[id(t)] for t, _ in model.teacher_pairs()]
        self._trained = [p for _, p in model.student_parameters() if p.requires_grad]

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """The model's terms; under bf16, DeepSpeed's forward enters the autocast itself."""
        self.engine.train()
        return self.engine(batch)

    def backward_step(self, total: torch.Tensor, lr: float) -> torch.Tensor | float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.engine.backward(total)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return norm.detach() if isinstance(norm, torch.Tensor) else float("nan") if norm is None else float(norm)

    @torch.no_grad()
    def weight_norm(self) -> torch.Tensor:
        """Global L2 norm of the trained student weights, a 0-dim tensor on the device (read in the
        loop's one host sync); under ZeRO-3 each rank takes its own partitions (``ds_tensor``,
        without their padding) and one all-reduce adds the squares, nothing is gathered."""
        parts = [own_elements(p) if self.zero3 else p for p in self._trained]
        sq = torch.stack([n.to(self.device) for n in torch._foreach_norm(parts)]).float().pow(2).sum()
        if self.zero3 and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(sq)
        return sq.sqrt()

    def update_teacher(self, momentum: float) -> None:
        self.teacher.update(momentum)

    def model_state(self) -> dict[str, torch.Tensor]:
        """The full fp32 state on every rank (ZeRO-3: gathered; a collective, every rank calls it)."""
        with self._ds.zero.GatheredParameters(list(self.module.parameters()), enabled=self.zero3):
            return {k: v.detach().clone().cpu() for k, v in self.module.state_dict().items()}

    def save(self, folder: Path, rank: int) -> None:
        """All ranks: DeepSpeed's sharded optimizer state; rank 0 also the full weights (safetensors)."""
        state = self.model_state()
        if rank == 0:
            checkpoint.write_model(folder, state)
        with writing_file(Path(folder) / DS_SUBDIR):
            self.engine.save_checkpoint(str(Path(folder) / DS_SUBDIR), tag=DS_TAG)

    def load(self, folder: Path) -> None:
        path = Path(folder) / DS_SUBDIR
        if not path.is_dir():
            raise MissingFileError(f"{folder}: no {DS_SUBDIR}/ state; it was written by the torch engine "
                                    "(resume with train.engine=torch, or start a new run)")
        self.engine.load_checkpoint(str(path), tag=DS_TAG, load_module_strict=True)
        saved = checkpoint.read_model(folder)  # the teacher: not in the optimizer's state under ZeRO-3
        self.teacher.load([saved[name] for name in self._teacher_names])
