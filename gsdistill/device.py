"""The one device resolver of every stage: a config's device name -> ``torch.device``.

A CUDA build of torch on a machine whose driver it cannot use (the driver is older than the wheel's
CUDA, say) reports no GPU. ``auto`` then runs on the CPU, and says so in one line with torch's own
reason whenever an NVIDIA device is visible; ``cuda`` fails with that reason, naming the config key.
"""
from __future__ import annotations

import glob
import sys

import torch

from gsdistill.errors import InputError

_warned: set[str] = set()  # one fallback line per process and reason, not one per call


def nvidia_device_visible() -> bool:
    """An NVIDIA GPU is attached to this machine or container (its device nodes exist)."""
    return bool(glob.glob("/dev/nvidia[0-9]*") or glob.glob("/proc/driver/nvidia/gpus/*"))


def cuda_unusable_reason() -> str:
    """Why torch sees no CUDA device: the build it is, and the driver's complaint, in one line."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    reason = "no CUDA device found"
    try:
        torch.cuda.init()
    except Exception as e:  # torch's RuntimeError/AssertionError text is the useful part
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"torch {torch.__version__} (built for CUDA {torch.version.cuda}): {reason}"


def resolve_device(name: str | None, local_rank: int = 0, key: str = "device") -> torch.device:
    """The one device resolver: ``None``/``""``/``auto`` -> ``cuda:<local_rank>`` when CUDA is present,
    else ``cpu``; ``cuda`` -> ``cuda:<local_rank>``; ``cuda:N``, ``cpu`` and ``mps`` as named.
    Raises :class:`InputError` naming ``key`` for an unknown name or a CUDA device that is not there."""
    name = "auto" if name in (None, "") else str(name)
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        else:
            if nvidia_device_visible():
                reason = cuda_unusable_reason()
                if reason not in _warned:
                    _warned.add(reason)
                    print(f"gsdistill: {key}=auto: an NVIDIA GPU is present but unusable ({reason}); "
                          "running on the CPU", file=sys.stderr)
            return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"{key} must be auto, cpu, cuda or cuda:N, got {name!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"{key}={name}: no CUDA device torch can use ({cuda_unusable_reason()}); "
                             f"set {key}=cpu or {key}=auto to run on the CPU")
        index = local_rank if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise InputError(f"{key}={name}: only {torch.cuda.device_count()} CUDA device(s) present, "
                             f"this process wants cuda:{index}")
        return torch.device("cuda", index)
    if device.type not in ("cpu", "mps"):
        raise InputError(f"{key} must be auto, cpu, cuda or cuda:N, got {name!r}")
    return device
