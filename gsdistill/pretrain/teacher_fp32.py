"""The EMA teacher under DeepSpeed: an fp32 update, in place, where the weights live.

The module's weights are fp32 under every precision (``train.precision: bf16`` is DeepSpeed's
``torch_autocast``, which casts inside the forward, not the weights), so the teacher's own weights
are its fp32 master, and after DeepSpeed's step each student weight equals its optimizer's fp32
master (copied back from the CPU under optimizer offload). The update
``t <- t + (1 - m) (s - t)`` therefore runs on the module's own storage, on the device that
holds it: the GPU under ZeRO-2 and optimizer-only offload, pinned CPU memory under parameter
offload. Nothing crosses PCIe for it. (In bf16 weights the step would be below half a bf16 step,
2^-9 of ``|t|``, for most weights at momentum 0.996 and be rounded away.)

Under ZeRO-3 nothing is gathered: teacher and student weights of the same name have the same
shape, so rank ``r`` holds the same slice ``[r * p, (r + 1) * p)`` of both flat tensors
(``ds_tensor``, ``p`` elements, zero-padded at the end), and the EMA runs on these local slices.
A weight ZeRO-3 keeps whole on every rank (``ds_persist``: below
``stage3_param_persistence_threshold``) is updated in its whole copy too, from the student's whole
copy, which DeepSpeed re-gathered after its step: the same fp32 arithmetic on the same values, so
slice and whole copy stay equal without a collective.
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


def _separate_whole_copy(p: nn.Parameter) -> bool:
    """A persistent ZeRO-3 weight gathered into memory of its own (alone, ZeRO-3 may gather a
    weight into its slice's memory: updating both would apply the EMA twice)."""
    return (getattr(p, "ds_persist", False) and p.data.numel() == p.ds_numel > 0
            and p.data.untyped_storage().data_ptr() != p.ds_tensor.untyped_storage().data_ptr())


def _copies(t: nn.Parameter, s: nn.Parameter) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(teacher, student) copies of one weight pair's value this rank holds: the whole tensors, or
    their ZeRO-3 slices and, for persistent weights gathered apart, their whole copies too. Read at
    each call: ZeRO-3 rebinds ``.data`` when it gathers or releases a weight."""
    if not _zero3(t):
        return [(t.data, s.data)]
    whole = [(t.data, s.data)] if _separate_whole_copy(t) and _separate_whole_copy(s) else []
    return [(t.ds_tensor, s.ds_tensor), *whole]


def _slice_of(full: torch.Tensor, p: nn.Parameter) -> torch.Tensor:
    """This rank's ZeRO-3 slice of the full tensor ``full`` of ``p``, zero-padded."""
    size = p.ds_tensor.numel()
    flat = full.detach().reshape(-1)
    start = size * _partition_rank(p)
    part = torch.zeros(size, dtype=p.ds_tensor.dtype)
    n = max(0, min(size, flat.numel() - start))
    part[:n] = flat[start:start + n]
    return part


class TeacherEMA:
    """The EMA update of the teacher weights of ``pairs`` (teacher, student) in the module's storage."""

    def __init__(self, pairs: list[tuple[nn.Parameter, nn.Parameter]]):
        wrong = sorted({str(p.dtype) for pair in pairs for p in pair if p.dtype != torch.float32})
        if wrong:  # bf16 weights would round the EMA away (module docstring)
            raise TypeError(f"the EMA teacher needs fp32 module weights, got {', '.join(wrong)}")
        self.pairs = pairs

    @torch.no_grad()
    def update(self, momentum: float) -> None:
        """``teacher = m * teacher + (1 - m) * student``, one fused op over every local copy."""
        copies = [c for t, s in self.pairs for c in _copies(t, s)]
        if copies:
            torch._foreach_lerp_([t for t, _ in copies], [s for _, s in copies], 1.0 - momentum)

    @torch.no_grad()
    def load(self, full: list[torch.Tensor]) -> None:
        """The teacher weights from full fp32 tensors (a checkpoint's): each rank keeps its slice."""
        for value, (t, s) in zip(full, self.pairs):
            for i, (copy, _) in enumerate(_copies(t, s)):
                source = _slice_of(value, t) if _zero3(t) and i == 0 else value
                copy.copy_(source.reshape(copy.shape))
