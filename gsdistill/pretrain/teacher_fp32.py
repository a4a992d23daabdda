"""The EMA teacher's fp32 master copy under DeepSpeed, whatever the precision of the module's weights.

With ``bf16`` DeepSpeed turns every weight of the module into bf16 and keeps fp32 master copies of
the *trained* ones only, in its optimizer. The teacher is not trained: in bf16 alone, an EMA step
``t + (1 - m) (s - t)`` at momentum 0.996 is below half a bf16 step (2^-9 of ``|t|``) for most
weights and is rounded away, so the teacher would stay near its random start. This class keeps
the teacher in fp32, takes the student from DeepSpeed's fp32 masters (not from its bf16 copy),
updates in fp32 and writes the rounded result into the module's teacher weights that the forward
reads.

Under ZeRO-3 nothing is gathered: teacher and student weights of the same name have the same shape,
so rank ``r`` holds the same slice ``[r * p, (r + 1) * p)`` of both flat tensors (``ds_tensor``,
``p`` elements, zero-padded at the end), and the EMA runs on these local slices. A weight ZeRO-3
keeps whole on every rank (``ds_persist``: below ``stage3_param_persistence_threshold``) is then
gathered again from the new slices, as DeepSpeed does for the student after its step.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _zero3(p: nn.Parameter) -> bool:
    """A ZeRO-3 weight: its value lives in the ranks' slices (``ds_tensor``)."""
    return hasattr(p, "ds_tensor")


def _partition_rank(p: nn.Parameter) -> int:
    if not dist.is_initialized():
        return 0
    return dist.get_rank(group=getattr(p, "ds_process_group", None))


def own_elements(p: nn.Parameter) -> torch.Tensor:
    """The elements of ``p``'s local ZeRO-3 slice that belong to it (the last ranks' slices end in
    padding, which DeepSpeed leaves uninitialised)."""
    size = p.ds_tensor.numel()
    return p.ds_tensor.narrow(0, 0, max(0, min(size, p.ds_numel - size * _partition_rank(p))))


def _slice(full: torch.Tensor, p: nn.Parameter) -> torch.Tensor:
    """This rank's ZeRO-3 slice of the full tensor ``full`` of ``p``, in fp32 beside ``p.ds_tensor``."""
    size = p.ds_tensor.numel()
    flat = full.detach().reshape(-1).to(torch.float32)
    start = size * _partition_rank(p)
    part = torch.zeros(size, dtype=torch.float32, device=p.ds_tensor.device)
    n = max(0, min(size, flat.numel() - start))
    part[:n] = flat[start:start + n].to(part.device)
    return part


def local_slice(full: torch.Tensor, p: nn.Parameter) -> torch.Tensor:
    """The fp32 master layout of ``p``: its ZeRO-3 slice, or all of it (no ZeRO-3, or persistent)."""
    return _slice(full, p) if _zero3(p) else full.detach().to(p.device, torch.float32).clone()


def _module_data(p: nn.Parameter) -> torch.Tensor:
    """The storage the forward's weight comes from: the local ZeRO-3 slice, or the whole tensor."""
    return p.ds_tensor if _zero3(p) else p.data


def _write(pairs: list[tuple[nn.Parameter, nn.Parameter]], masters: list[torch.Tensor]) -> None:
    """The module's teacher weights = ``masters`` (rounded to their dtype); the ones ZeRO-3 keeps
    whole are gathered again from their new slices."""
    for master, (t, _) in zip(masters, pairs):
        _module_data(t).copy_(master.reshape(_module_data(t).shape))
    persistent = [t for t, _ in pairs if _zero3(t) and getattr(t, "ds_persist", False)]
    if persistent:
        persistent[0].all_gather(persistent)


def student_fp32(s: nn.Parameter) -> torch.Tensor:
    """The student's fp32 master (local ZeRO-3 slice or full), from DeepSpeed's optimizer; a frozen
    student weight has none and is its own value."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_local_fp32_param

    master = safe_get_local_fp32_param(s) if _zero3(s) else safe_get_full_fp32_param(s)
    return master if master is not None else _module_data(s).float()


class Fp32Teacher:
    """fp32 master of the teacher weights of ``pairs`` (teacher, student), built from the model's
    full fp32 teacher before ``deepspeed.initialize`` (``full``) and re-sliced after it."""

    def __init__(self, pairs: list[tuple[nn.Parameter, nn.Parameter]], full: list[torch.Tensor]):
        self.pairs = pairs
        self.masters = [local_slice(f, t) for f, (t, _) in zip(full, pairs)]

    @torch.no_grad()
    def update(self, momentum: float) -> None:
        """``master = m * master + (1 - m) * student`` in fp32, then the module's teacher = master."""
        if not self.pairs:
            return
        students = [student_fp32(s).reshape(m.shape).to(m.device) for m, (_, s) in zip(self.masters, self.pairs)]
        torch._foreach_lerp_(self.masters, students, 1.0 - momentum)
        _write(self.pairs, self.masters)

    @torch.no_grad()
    def full(self, device: torch.device) -> list[torch.Tensor]:
        """Every teacher weight in full fp32 on the CPU (ZeRO-3: one all-gather of all local slices)."""
        sliced = [i for i, (t, _) in enumerate(self.pairs) if _zero3(t)]
        out = [m.cpu() for m in self.masters]
        if not sliced:
            return out
        flat = torch.cat([self.masters[i] for i in sliced]).to(device)
        world = dist.get_world_size() if dist.is_initialized() else 1
        parts = [flat] if world == 1 else [torch.empty_like(flat) for _ in range(world)]
        if world > 1:
            dist.all_gather(parts, flat)
        per_rank = [part.cpu().split([self.masters[i].numel() for i in sliced]) for part in parts]
        for j, i in enumerate(sliced):
            t = self.pairs[i][0]
            out[i] = torch.cat([rank_parts[j] for rank_parts in per_rank])[:t.ds_numel].reshape(t.ds_shape)
        return out

    @torch.no_grad()
    def load(self, full: list[torch.Tensor]) -> None:
        """Masters (and the module's teacher) from full fp32 tensors, e.g. a checkpoint's."""
        self.masters = [local_slice(f, t) for f, (t, _) in zip(full, self.pairs)]
        _write(self.pairs, self.masters)
