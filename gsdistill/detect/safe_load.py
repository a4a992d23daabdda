"""Load Ultralytics ``.pt`` files without running code from them.

An Ultralytics checkpoint is a pickle: unpickled normally, a crafted ``.pt`` runs any code it names.
Ultralytics (8.4) has an opt-in restricted path: ``torch.load(weights_only=True)`` against an
allow-list of torch and Ultralytics classes, switched on per process by ``ULTRALYTICS_SAFE_LOAD=1``
or per call by ``torch_safe_load(..., safe_only=True)``. A gsdistill detector also holds timm's ViT
classes, the gsdistill layers and the ViT's ``PatchProjection``, which that allow-list lacks, so
:func:`load_yolo` adds exactly those (``nn.Module`` subclasses and enums of ``timm.layers`` /
``timm.models``, ``gsdistill.detect.modules`` and ``gsdistill.models.backbone``, and only the ones
the file names) before loading through Ultralytics' restricted path. Anything else the file names
(``os.system``, ``builtins.eval``, ...) is refused before a byte of it runs.
"""
from __future__ import annotations

import contextlib
import enum
import importlib
import os
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import gsdistill.detect.modules  # noqa: E402,F401  (registers the layers with Ultralytics)
from gsdistill.errors import GsdistillError  # noqa: E402

# what a file this package writes may name; used to report what else a file names
TRUSTED_PREFIXES = ("torch.", "ultralytics.", "timm.", "gsdistill.detect.modules.", "gsdistill.models.backbone.",
                    "numpy.", "collections.", "pathlib.")
_EXTRA_MODULES = ("gsdistill.detect.modules", "gsdistill.models.backbone")  # the latter: the ViT's PatchProjection
_EXTRA_PACKAGES = ("timm.layers", "timm.models")


class UnsafeCheckpointError(GsdistillError, ValueError):
    """A ``.pt`` that names code outside the allow-list (the message names the file and those names)."""


def _allowed_extra(name: str):
    """The class ``name`` refers to when it is a gsdistill layer or a timm module/enum class, else None."""
    module, _, attr = name.rpartition(".")
    if module not in _EXTRA_MODULES and not any(module == p or module.startswith(p + ".") for p in _EXTRA_PACKAGES):
        return None
    obj = getattr(importlib.import_module(module), attr, None)
    if isinstance(obj, type) and obj.__module__ == module and issubclass(obj, (nn.Module, enum.Enum)):
        return obj
    return None


def register_extra_globals(path: str | Path) -> list[str]:
    """Allow the gsdistill / timm classes that ``path`` names for ``weights_only`` loading; return them.

    Reading the names scans the pickle's opcodes only (``torch.serialization.get_unsafe_globals_in_checkpoint``);
    nothing in the file is executed.
    """
    try:
        needed = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except (ValueError, RuntimeError):  # not a torch zip archive: the load itself reports it
        return []
    allowed = [(name, obj) for name in needed if (obj := _allowed_extra(name)) is not None]
    if allowed:
        torch.serialization.add_safe_globals([obj for _, obj in allowed])
    return [name for name, _ in allowed]


def foreign_globals(path: str | Path) -> list[str]:
    """Names in ``path`` outside torch / Ultralytics / timm / gsdistill layers (for the error message)."""
    try:
        needed = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except (ValueError, RuntimeError):
        return []
    return sorted(n for n in needed if not n.startswith(TRUSTED_PREFIXES))


@contextlib.contextmanager
def restricted_loading():
    """Turn on Ultralytics' restricted loading (what ``ULTRALYTICS_SAFE_LOAD=1`` does) for this block."""
    from ultralytics.nn import tasks

    before = tasks.SAFE_LOAD
    tasks.SAFE_LOAD = True  # read by torch_safe_load and the restricted parse_model at call time
    try:
        yield
    finally:
        tasks.SAFE_LOAD = before


def load_yolo(path: str | Path, safe: bool = True):
    """``ultralytics.YOLO(path)``; with ``safe`` the file is unpickled with ``weights_only=True`` only.

    Raises FileNotFoundError for a missing file, :class:`UnsafeCheckpointError` for a file that
    names code outside the allow-list or cannot be read as a checkpoint, and InputError for weights
    holding NaN/inf (a detector exported from a diverged backbone).
    """
    from gsdistill.detect.finite import check_finite_detector

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights: {path} does not exist")
    model = _load(path, safe)
    check_finite_detector(model.model, path)
    return model


def _load(path: Path, safe: bool):
    from ultralytics import YOLO

    if not safe:
        return YOLO(str(path))
    register_extra_globals(path)
    try:
        with restricted_loading():
            return YOLO(str(path))
    except (TypeError, ModuleNotFoundError, AttributeError) as e:
        foreign = foreign_globals(path)
        if foreign:
            raise UnsafeCheckpointError(
                f"{path}: refused to load: the file names code outside torch/Ultralytics/timm/gsdistill "
                f"({', '.join(foreign[:6])}); a .pt is a pickle, and one from an untrusted source is a program. "
                "Set safe_load=false only for a file you made yourself") from None
        raise UnsafeCheckpointError(f"{path}: not a loadable Ultralytics checkpoint "
                                    f"({str(e).splitlines()[0][:200]})") from None
