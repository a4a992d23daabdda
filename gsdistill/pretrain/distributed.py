"""Process-group set-up from the launcher's environment (``torchrun`` / ``deepspeed``) and small collectives."""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from gsdistill.errors import InputError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pick_device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise InputError("train.device=cuda but no CUDA device is available")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if name != "cpu":
        raise InputError(f"train.device must be auto, cpu or cuda, got {name!r}")
    return torch.device("cpu")


def setup(engine: str, device_name: str) -> tuple[int, int, torch.device]:
    """``(rank, world_size, device)``; initialises the process group when launched with several
    ranks, or for DeepSpeed even with one (it always needs one; the env vars are then filled in)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name, local_rank)
    if (world > 1 or engine == "deepspeed") and not dist.is_initialized():
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


def any_rank(flag: bool, device: torch.device) -> bool:
    """True when ``flag`` is true on at least one rank (so every rank takes the same branch)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def mean_over_ranks(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Average a dict of scalars over ranks (same keys on every rank)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist()))
