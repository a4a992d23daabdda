"""Cross-device helpers: gather candidates with gradients, rank offsets, world-aware sums.

Every function is the identity (or a local sum) when ``torch.distributed`` is not initialised,
so the same loss code runs on one process or many. Rows per rank are all-gathered (a tiny
collective and a host read per call) unless the caller knows them on the host and passes
``sizes`` (e.g. ``equal_sizes(n)`` for fixed per-rank batches); with value checks on
(``validation.set_checks``, the first step of a run) given sizes are checked against the gathered ones.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gsdistill.losses.validation import checks_enabled


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


def equal_sizes(n_local: int) -> list[int]:
    """Rows per rank when every rank holds ``n_local`` (fixed per-rank batches): known on the host,
    no collective."""
    return [int(n_local)] * world_size()


def _host_sizes(n_local: int, sizes: list[int] | None, device: torch.device | None = None) -> list[int]:
    """``sizes`` when given (checked against the all-gathered sizes while value checks are on),
    else the all-gathered sizes."""
    if sizes is None:
        return local_sizes(n_local, device)
    sizes = [int(n) for n in sizes]
    if len(sizes) != world_size() or sizes[dist.get_rank() if is_distributed() else 0] != n_local:
        raise ValueError(f"sizes {sizes} do not fit {world_size()} ranks with {n_local} rows on this one")
    if checks_enabled() and is_distributed():
        actual = local_sizes(n_local, device)
        if actual != sizes:
            raise ValueError(f"rows per rank are {actual}, but the caller said {sizes} (per-rank batches "
                             "must be the same size on every rank)")
    return sizes


def rank_offset(n_local: int, sizes: list[int] | None = None) -> int:
    """Index of this rank's first row in a tensor built by ``gather_with_grad`` (a collective
    unless ``sizes`` are given: every rank calls it with its own ``n_local``; 0 on one process)."""
    if not is_distributed():
        return 0
    return sum(_host_sizes(n_local, sizes)[: dist.get_rank()])


def _collective_device() -> torch.device:
    backend = dist.get_backend()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _GatherWithGrad(torch.autograd.Function):
    """Forward: all-gather (uneven sizes allowed). Backward: sum the gathered gradient over ranks
    (every rank's loss may depend on this rank's rows), return this rank's slice."""

    @staticmethod
    def forward(ctx, x: Tensor, sizes: list[int] | None) -> Tensor:  # noqa: D102
        sizes = _host_sizes(x.shape[0], sizes, x.device)
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
        return grad[start:stop], None


def gather_with_grad(x: Tensor, sizes: list[int] | None = None) -> Tensor:
    """Concatenate ``x: [n_local, ...]`` from all ranks along dim 0 -> ``[sum n_local, ...]``.

    The local slice keeps its gradient, and the backward pass sums over ranks the gradient that
    reaches each row, so a rank's rows receive the gradient of the SUM of all ranks' losses.
    With each rank's loss = mean over its local anchors against all gathered candidates, and
    gradients averaged over ranks (DDP / DeepSpeed do this), the parameter gradients equal those of
    one process holding the whole batch (tested with 2 gloo processes). Do not also multiply the
    loss by the world size. Every rank must call it (a collective). Identity on one process.
    ``sizes``: rows of every rank, in rank order, when known on the host (spares the size
    all-gather and its host read).
    """
    if not is_distributed():
        return x
    return _GatherWithGrad.apply(x, sizes)
