"""Count host syncs: the tensor operations that make the host wait for the device.

On a GPU each of these blocks the Python thread until the device has caught up: reading a value
(``.item()``, ``int(t)``, ``float(t)``, ``bool(t)``, ``.tolist()``, all ``aten._local_scalar_dense``)
and ops whose output shape depends on the data (``nonzero``, boolean-mask indexing,
``masked_select``, ``unique``, ``repeat_interleave`` with tensor repeats). ``HostSyncCounter`` sees
them at the aten level with a ``TorchDispatchMode``, so it counts the same on the CPU as on a GPU
(tests and ``tools/bench_pretrain.py`` run without one) and sees syncs inside torch's own Python
code and in backward passes too. Each sync is recorded with the innermost gsdistill frame that
caused it (``file:line``), so a test can ask "any sync inside ``gsdistill/losses``?".
"""
from __future__ import annotations

import sys
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SYNC_OPS = {"_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "unique",
             "_unique", "_unique2", "unique_dim", "unique_consecutive", "repeat_interleave",
             "equal", "is_nonzero"}


def _is_sync(func, args) -> bool:
    name = func._schema.name.split("::")[-1]
    if name in _SYNC_OPS:
        return not (name == "repeat_interleave" and not isinstance(args[0], torch.Tensor))
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):  # a bool mask index -> nonzero
        indices = args[1] if len(args) > 1 else []
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    return False


def _caller() -> str:
    """``path:line`` of the innermost frame in the gsdistill package (else the innermost frame)."""
    frame = sys._getframe(2)
    first = None
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        here = f"{path}:{frame.f_lineno}"
        first = first or here
        if "/gsdistill/" in path and not path.endswith("/losses/syncs.py"):
            return here[path.rindex("/gsdistill/") + 1:]
        frame = frame.f_back
    return first or "?"


class HostSyncCounter(TorchDispatchMode):
    """``with HostSyncCounter() as syncs: ...`` then ``syncs.total``, ``syncs.where`` (Counter of
    ``file:line``) and ``syncs.inside("gsdistill/losses/")``. Slows ops down: count, do not time."""

    def __init__(self) -> None:
        super().__init__()
        self.where: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        if _is_sync(func, args):
            self.where[f"{func._schema.name.split('::')[-1]} @ {_caller()}"] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.where.values())

    def inside(self, prefix: str) -> dict[str, int]:
        """The syncs whose gsdistill frame is under ``prefix`` (e.g. ``"gsdistill/losses/"``)."""
        return {k: v for k, v in self.where.items() if k.split(" @ ")[-1].startswith(prefix)}
