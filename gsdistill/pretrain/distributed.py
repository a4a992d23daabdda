"""Process-group set-up from the launcher's environment (``torchrun`` / ``deepspeed``) and the few
collectives every training loop shares (pretraining and text retrievers alike). The device resolver
is :func:`gsdistill.device.resolve_device` (re-exported here).

Timeouts: the process group gets ``train.dist_timeout_minutes`` (NCCL's own default is 10
minutes). Waiting for rank 0 to prepare the data (generate pages, embed texts: longer than any
collective should take) runs on a separate gloo group with its own, longer timeout
(:func:`rank0_then_all`), so that neither limit has to stretch to cover the other.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from gsdistill.device import resolve_device

__all__ = ["any_rank", "average_gradients", "join_from_env", "pick_device",
           "rank0_then_all", "rank_and_world", "resolve_device", "setup"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pick_device(name: str, local_rank: int, key: str = "device") -> torch.device:
    """:func:`resolve_device`, made the current CUDA device of this process."""
    device = resolve_device(name, local_rank, key)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def join_from_env(device: torch.device, always: bool = False, timeout: timedelta | None = None) -> bool:
    """Join the process group the launcher describes (``WORLD_SIZE`` > 1, or ``always``: DeepSpeed
    wants one even alone, the env vars are then filled in); nccl on CUDA, gloo on CPU. ``timeout``:
    of every collective (None: torch's default, 10 minutes under NCCL)."""
    if dist.is_initialized():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 and not always:
        return False
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    kwargs = {"timeout": timeout} if timeout is not None else {}
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", **kwargs)
    return True


def setup(engine: str, device_name: str, timeout: timedelta | None = None) -> tuple[int, int, torch.device]:
    """``(rank, world_size, device)`` of a pretraining run (errors name ``train.device``); joins the
    process group when launched with several ranks."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = pick_device(device_name, int(os.environ.get("LOCAL_RANK", "0")), "train.device")
    join_from_env(device, always=engine == "deepspeed", timeout=timeout)
    return rank, world, device


def rank0_then_all(make: Callable[[], str], wait: timedelta) -> str:
    """Rank 0 runs ``make()``; every rank returns its result. The other ranks wait for it on a gloo
    group whose timeout is ``wait``, not in a collective of the main group, whose (shorter) timeout
    would end them while rank 0 is still generating or embedding data. Should rank 0 fail, the
    launcher (torchrun, deepspeed) stops the waiting ranks."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return make()
    group = dist.new_group(backend="gloo", timeout=wait)
    box = [make() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0, group=group)
    dist.destroy_process_group(group)
    return box[0]


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the joined process group; ``(0, 1)`` when alone."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def any_rank(flag: bool, device: torch.device) -> bool:
    """True when ``flag`` is true on at least one rank (so every rank takes the same branch)."""
    if rank_and_world()[1] == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Average the gradients over ranks in one flat all-reduce (what DDP does), for engines that run
    several backward passes per step (GradCache, accumulation) where DDP's hooks do not fit.
    Parameters without a gradient are left alone: every rank runs the same code, so the set agrees,
    and AdamW then skips them on every rank alike (a zero-filled gradient would decay them)."""
    _, world = rank_and_world()
    grads = [p.grad for p in params if p.grad is not None]
    if world == 1 or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))
