"""The one device resolver of every stage: a config's device name -> ``torch.device``."""
from __future__ import annotations

import torch

from gsdistill.errors import InputError


def resolve_device(name: str | None, local_rank: int = 0) -> torch.device:
    """The one device resolver: ``None``/``""``/``auto`` -> ``cuda:<local_rank>`` when CUDA is present,
    else ``cpu``; ``cuda`` -> ``cuda:<local_rank>``; ``cuda:N``, ``cpu`` and ``mps`` as named.
    Raises :class:`InputError` for an unknown name or a CUDA device that is not there."""
    name = "auto" if name in (None, "") else str(name)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {name!r} asked for, but no CUDA device is available")
        index = local_rank if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise InputError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        return torch.device("cuda", index)
    if device.type not in ("cpu", "mps"):
        raise InputError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return device
