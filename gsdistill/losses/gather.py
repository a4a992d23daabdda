"""Cross-device helpers: gather candidates with gradients, rank offsets, world-aware sums.

Every function is the identity (or a local sum) when ``torch.distributed`` is not initialised,
so the same loss code runs on one process or many.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def is_distributed() -> bool:
    """True when a process group is initialised with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def all_reduce_sum(x: Tensor) -> Tensor:
    """Sum of ``x`` over ranks (in place on a copy; no gradient). Identity on one process."""
    if not is_distributed():
        return x
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def local_sizes(n_local: int, device: torch.device | None = None) -> list[int]:
    """Rows held by every rank, in rank order (all-gathered)."""
    if not is_distributed():
        return [int(n_local)]
    dev = device if device is not None else _collective_device()
    sizes = [torch.zeros(1, dtype=torch.long, device=dev) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([int(n_local)], dtype=torch.long, device=dev))
    return [int(s.item()) for s in sizes]


def rank_offset(n_local: int) -> int:
    """Index of this rank's first row in a tensor built by ``gather_with_grad`` (a collective:
    every rank calls it with its own ``n_local``; 0 on one process)."""
    if not is_distributed():
        return 0
    return sum(local_sizes(n_local)[: dist.get_rank()])


def _collective_device() -> torch.device:
    backend = dist.get_backend()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _GatherWithGrad(torch.autograd.Function):
    """Forward: all-gather (uneven sizes allowed). Backward: sum the gathered gradient over ranks
    (every rank's loss may depend on this rank's rows), return this rank's slice."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: D102
        sizes = local_sizes(x.shape[0], x.device)
        rank = dist.get_rank()
        ctx.bounds = (sum(sizes[:rank]), sum(sizes[: rank + 1]))
        biggest = max(sizes)
        padded = x.new_zeros((biggest,) + tuple(x.shape[1:]))
        padded[: x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([p[:n] for p, n in zip(parts, sizes)], dim=0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: D102
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start, stop = ctx.bounds
        return grad[start:stop]


def gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x: [n_local, ...]`` from all ranks along dim 0 -> ``[sum n_local, ...]``.

    The local slice keeps its gradient, and the backward pass sums over ranks the gradient that
    reaches each row, so a rank's rows receive the gradient of the SUM of all ranks' losses.
    With each rank's loss = mean over its local anchors against all gathered candidates, and
    gradients averaged over ranks (DDP / DeepSpeed do this), the parameter gradients equal those of
    one process holding the whole batch (tested with 2 gloo processes). Do not also multiply the
    loss by the world size. Every rank must call it (a collective). Identity on one process.
    """
    if not is_distributed():
        return x
    return _GatherWithGrad.apply(x)
