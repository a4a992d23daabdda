"""Full precision for the numerics that decide training quality, whatever the autocast setting.

Under bf16 autocast a matmul or einsum runs in bf16 even when its inputs are float32: bf16 keeps
8 bits of mantissa, so a cosine near 1 is rounded to steps of 2^-8 ~ 3.9e-3 (4.8e-3 measured on
the DINO head's prototype logits), about the 0.0027 spread between pages that the demo's teacher
temperature sharpens. The losses, the prototype logits and the alignment scores therefore run with
autocast switched off, on float32 (float64 kept) inputs, and return float32 terms.
"""
from __future__ import annotations

from contextlib import AbstractContextManager

import torch
from torch import Tensor


def fp32(x: Tensor) -> Tensor:
    """``x`` as float32, or as it is when it is float64 (a reference run keeps its precision)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def no_autocast(x: Tensor) -> AbstractContextManager:
    """Autocast off for the device type of ``x`` (on a GPU the CUDA autocast, on the CPU the CPU one)."""
    return torch.autocast(device_type=x.device.type, enabled=False)


def tf32_for_float32_islands(device) -> None:
    """On CUDA under bf16 autocast: let the float32 islands (the prototype cosines, the losses) use
    TF32 tensor cores: 10 mantissa bits on the inputs (rounding ~1e-4 on a cosine of 256-d unit
    vectors, against bf16's 4.8e-3 on its output), float32 accumulation and output. Both
    pretraining engines call it; elsewhere it does nothing."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
