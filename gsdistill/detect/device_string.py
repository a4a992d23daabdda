"""The device string Ultralytics takes (``"cpu"``, ``"0"``, ``"0,1"``), from a gsdistill ``device`` key.

Its own module so that training (:mod:`~gsdistill.detect.pipeline`), evaluation and prediction all use it
without importing one another.
"""
from __future__ import annotations

from gsdistill.device import resolve_device as torch_device


def resolve_device(device: str | None) -> str:
    """Ultralytics device string of ``device``: CUDA indices (``"0"``, ``"0,1"``) as given; any other
    name through :func:`gsdistill.device.resolve_device` (null/auto: CUDA 0 when present, else cpu)."""
    if device not in (None, "") and all(p.strip().isdigit() for p in str(device).split(",")):
        return str(device)
    d = torch_device(device)
    return d.type if d.type in ("cpu", "mps") else str(d.index)
