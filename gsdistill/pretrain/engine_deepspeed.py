"""DeepSpeed engine: ZeRO-3 with optimizer and parameter offload to CPU (configs/deepspeed/).

Same surface as :class:`gsdistill.pretrain.engine_torch.TorchEngine`. The optimizer is the same torch
AdamW with the same parameter groups, so both engines give the same losses on the same seed
(tested). Under ZeRO-3 every rank holds a slice of each parameter; the weight export gathers the
full tensors with ``deepspeed.zero.GatheredParameters``.

``train.precision: bf16`` is DeepSpeed's bf16 mode: the module's weights are bf16 (fp32 masters of
the trained ones in the optimizer), the batch's float tensors are cast to bf16 to meet them, and the
forward runs under the same bf16 autocast as the torch engine, so that the ops autocast keeps in
fp32 (softmax, log-softmax, norms) stay fp32 in both engines. The EMA teacher keeps an fp32 master
of its own (:mod:`gsdistill.pretrain.teacher_fp32`), updated from the student's fp32 masters; the
checkpoint's ``model.safetensors`` holds those fp32 masters, student and teacher alike.

Needs ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (set by ``deepspeed``/``torchrun``, or
by the trainer for one process). The first ``deepspeed.initialize`` on a machine JIT-builds a
small communication op (~1 min on 2 CPU cores); ``TORCH_EXTENSIONS_DIR`` caches it.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from gsdistill.errors import CorruptFileError, MissingFileError
from gsdistill.pretrain import checkpoint
from gsdistill.pretrain.engine_torch import build_adamw, param_groups
from gsdistill.pretrain.teacher_fp32 import Fp32Teacher, own_elements

DS_SUBDIR, DS_TAG = "deepspeed", "state"


def load_ds_config(path: str | Path, cfg, micro_batch: int) -> dict:
    """The JSON config with the keys this trainer owns filled in from the pretrain config."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"train.deepspeed_config: deepspeed config not found: {path}")
    try:
        ds = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path}: not valid JSON ({e})") from None
    ds.pop("_comment", None)
    ds["train_micro_batch_size_per_gpu"] = int(micro_batch)
    ds["gradient_accumulation_steps"] = 1
    ds["gradient_clipping"] = float(cfg["optim"]["clip_grad"])
    if cfg["train"]["precision"] == "bf16":
        ds["bf16"] = {"enabled": True}
    return ds


class DeepSpeedEngine:
    def __init__(self, model: nn.Module, cfg, device: torch.device, world_size: int, micro_batch: int,
                 config_path: str | Path):
        import deepspeed

        self._ds = deepspeed
        self.module = model
        self.device = device
        self.bf16 = cfg["train"]["precision"] == "bf16"
        optimizer = build_adamw(param_groups(model, float(cfg["optim"]["weight_decay"])), cfg["optim"])
        ds_config = load_ds_config(config_path, cfg, micro_batch)
        teacher_start = [t.detach().float().cpu() for t, _ in model.teacher_pairs()]  # fp32, before bf16
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                                 config=ds_config)
        self.zero3 = ds_config.get("zero_optimization", {}).get("stage", 0) == 3
        self.teacher = Fp32Teacher(model.teacher_pairs(), teacher_start)
        names = {id(p): n for n, p in model.named_parameters()}
        self._teacher_names = [names[id(t)] for t, _ in model.teacher_pairs()]

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        self.engine.train()
        if self.bf16:  # the weights are bf16: so must the inputs of the first convolution be
            batch = {k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                     for k, v in batch.items()}
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.engine(batch)

    def backward_step(self, total: torch.Tensor, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.engine.backward(total)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    @torch.no_grad()
    def weight_norm(self) -> float:
        """Global L2 norm of the trained student weights; under ZeRO-3 each rank sums the squares of
        its own partitions (``ds_tensor``, without their padding) and one all-reduce adds them,
        nothing is gathered."""
        params = [p for _, p in self.module.student_parameters() if p.requires_grad]
        parts = [own_elements(p) if self.zero3 else p for p in params]
        sq = torch.stack([t.detach().float().pow(2).sum().cpu() for t in parts]).sum().to(self.device)
        if self.zero3 and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(sq)
        return float(sq.sqrt())

    def _gathered(self, params):
        return self._ds.zero.GatheredParameters(list(params), enabled=self.zero3)

    def update_teacher(self, momentum: float) -> None:
        self.teacher.update(momentum)

    def model_state(self) -> dict[str, torch.Tensor]:
        """The full state on every rank, weights in fp32: the teacher's and the trained student
        weights' fp32 masters (a bf16 module would otherwise export its rounding)."""
        with self._gathered(self.module.parameters()):
            state = {k: v.detach().clone().cpu() for k, v in self.module.state_dict().items()}
        state.update(zip(self._teacher_names, self.teacher.full(self.device)))
        for name, p in self.module.student_parameters():
            master = self._ds.utils.safe_get_full_fp32_param(p) if p.dtype != torch.float32 else None
            if master is not None:  # a collective under ZeRO-3: every rank runs this same loop
                state[name] = master.detach().reshape(state[name].shape).cpu()
        return state

    def save(self, folder: Path, rank: int) -> None:
        """All ranks: DeepSpeed's sharded optimizer state; rank 0 also the full weights (safetensors)."""
        state = self.model_state()
        if rank == 0:
            checkpoint.write_model(folder, state)
        self.engine.save_checkpoint(str(Path(folder) / DS_SUBDIR), tag=DS_TAG)

    def load(self, folder: Path) -> None:
        path = Path(folder) / DS_SUBDIR
        if not path.is_dir():
            raise MissingFileError(f"{folder}: no {DS_SUBDIR}/ state; it was written by the torch engine "
                                    "(resume with train.engine=torch, or start a new run)")
        self.engine.load_checkpoint(str(path), tag=DS_TAG, load_module_strict=True)
        saved = checkpoint.read_model(folder)  # the teacher's fp32 masters (model_state)
        self.teacher.load([saved[name] for name in self._teacher_names])
