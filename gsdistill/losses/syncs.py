"""Count host syncs: the tensor operations that make the host wait for the device.

On a GPU each of these blocks the Python thread until the device has caught up: reading a value
(``.item()``, ``int(t)``, ``float(t)``, ``bool(t)``, ``.tolist()``, all ``aten._local_scalar_dense``)
and ops whose output shape depends on the data (``nonzero``, boolean-mask indexing,
``masked_select``, ``unique``, ``repeat_interleave`` with tensor repeats). ``HostSyncCounter`` sees
them at the aten level with a ``TorchDispatchMode``, so it counts the same on the CPU as on a GPU
(tests and ``tools/bench/bench_pretrain.py`` run without one) and sees syncs inside torch's own Python
code and in backward passes too. Each sync is recorded with the innermost gsdistill frame that
caused it (``file:line``), so a test can ask "any sync inside ``gsdistill/losses``?".
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gsdistill

_SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique",
             "_unique", "_unique2", "unique_dim", "unique_consecutive", "equal", "is_nonzero"}


def _is_sync(func, args, kwargs) -> bool:
    name = func._schema.name.split("::")[-1]
    if name == "repeat_interleave":  # tensor repeats without output_size: the size is read back
        return kwargs.get("output_size") is None and isinstance(args[-1] if len(args) < 3 else args[1],
                                                                 torch.Tensor)
    if name in _SYNC_OPS:
        return True
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):  # a bool mask index -> nonzero
        indices = args[1] if len(args) > 1 else []
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    return False


# the package's own folder, not any path with "/gsdistill/" in it: a clone named gsdistill holds
# its virtual environment (gsdistill/.venv/.../site-packages/torch) under the same prefix
_PACKAGE = Path(gsdistill.__file__).resolve().parent.as_posix() + "/"
_THIRD_PARTY = ("/site-packages/", "/dist-packages/", "/.venv/", "/venv/")


def package_path(path: str, package: str = _PACKAGE) -> str | None:
    """``gsdistill/<module path>`` when ``path`` is a file of the package at ``package``, else None
    (third-party code installed inside the package's folder is not the package)."""
    path = path.replace("\\", "/")
    if not path.startswith(package) or any(part in path[len(package) - 1:] for part in _THIRD_PARTY):
        return None
    return "gsdistill/" + path[len(package):]


def _caller() -> str:
    """``path:line`` of the innermost frame in the gsdistill package (else the innermost frame)."""
    frame = sys._getframe(2)
    first = None
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        first = first or f"{path}:{frame.f_lineno}"
        inside = package_path(path)
        if inside is not None and inside != "gsdistill/losses/syncs.py":
            return f"{inside}:{frame.f_lineno}"
        frame = frame.f_back
    return first or "?"


class HostSyncCounter(TorchDispatchMode):
    """``with HostSyncCounter() as syncs: ...`` then ``syncs.total``, ``syncs.where`` (Counter of
    ``file:line``) and ``syncs.inside("gsdistill/losses/")``. Slows ops down: count, do not time.

    ``host_tensors``: tensors that stay in host memory whatever the device (e.g. AdamW's ``step``
    counters, kept on the CPU unless ``capturable``); reading them is no sync, so it is not counted.
    """

    def __init__(self, host_tensors=()) -> None:
        super().__init__()
        self.where: Counter = Counter()
        self._host = {t.data_ptr() for t in host_tensors}

    def __enter__(self):  # ``tolist`` reads values without an aten op on the CPU: wrap it too
        self._tolist = torch.Tensor.tolist
        counter, tolist = self, self._tolist

        def counted_tolist(tensor):
            counter.where[f"tolist @ {_caller()}"] += 1
            return tolist(tensor)

        torch.Tensor.tolist = counted_tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        host_read = bool(self._host) and isinstance(args[0], torch.Tensor) and args[0].data_ptr() in self._host
        if not host_read and _is_sync(func, args, kwargs or {}):
            self.where[f"{func._schema.name.split('::')[-1]} @ {_caller()}"] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.where.values())

    def inside(self, prefix: str) -> dict[str, int]:
        """The syncs whose gsdistill frame is under ``prefix`` (e.g. ``"gsdistill/losses/"``)."""
        return {k: v for k, v in self.where.items() if k.split(" @ ")[-1].startswith(prefix)}
