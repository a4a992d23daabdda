"""Atomic training checkpoints and loading a pretrained GSDistill model.

Layout of ``RUN_DIR/checkpoints/``::

    step-000100/
        model.safetensors   full GSDistill state (student, EMA teacher, queues, DINO centres)
        optimizer.pt        optimizer state (torch engine; tensors only, loads with weights_only=True)
        deepspeed/          DeepSpeed's own optimizer-state checkpoint (deepspeed engine only)
        rng-rank<r>.pt      torch CPU (+ CUDA) RNG state of each rank
        state.json          step, data position, last logged metrics, world size
        config.yaml         the resolved run config
    latest                  text file naming the newest complete checkpoint

A checkpoint is written into ``.tmp-step-N`` and renamed into place only when complete, and
``latest`` is replaced atomically, so an interrupted save never leaves a half checkpoint behind.
A file damaged later (a truncated copy, a full disk) is named in the error; resuming from a run
falls back to its newest intact checkpoint (:func:`find_resumable`). Pruning is the trainer's:
it removes only checkpoints of its own run, by step number (:func:`prune`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import zipfile
from pathlib import Path

import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from gsdistill.errors import CorruptFileError, GsdistillError, InputError, MissingFileError, corrupt, writing_file
from gsdistill.output_removal import discard

MODEL_FILE, OPTIM_FILE, STATE_FILE, LATEST = "model.safetensors", "optimizer.pt", "state.json", "latest"


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def rng_file(rank: int) -> str:
    return f"rng-rank{rank}.pt"


def step_of(path: Path) -> int | None:
    """The step of a ``step-N`` folder (None for anything else)."""
    m = re.fullmatch(r"step-(\d+)", Path(path).name)
    return int(m.group(1)) if m else None


def checkpoints_in(ckpt_root: Path) -> list[Path]:
    """The ``step-N`` folders of a ``checkpoints/`` dir, oldest first by step number (not by name)."""
    found = [p for p in Path(ckpt_root).glob("step-*") if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=step_of)


def tmp_dir(ckpt_root: Path, step: int) -> Path:
    """The folder a checkpoint is assembled in (every rank writes its own RNG file there)."""
    path = Path(ckpt_root) / f".tmp-{checkpoint_name(step)}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_model(folder: Path, state: dict[str, torch.Tensor]) -> None:
    with writing_file(folder / MODEL_FILE):  # a full disk: one line naming the file and the free space
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(folder / MODEL_FILE))


def save_torch(obj, path: Path) -> None:
    """``torch.save``, a full disk (or the file size limit) being one line naming the file."""
    with writing_file(path):
        torch.save(obj, path)


def write_text(path: Path, text: str) -> None:
    with writing_file(path):
        path.write_text(text)


def discard_partial(folder: Path) -> None:
    """Remove the checkpoint folder being assembled (``.tmp-step-N``, this run's own) after a failed write:
    the checkpoints before it stay as they were, and no half-written one is left to be mistaken for one."""
    if folder.name.startswith(".tmp-") and folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)


def write_rng(folder: Path, rank: int) -> None:
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    save_torch(rng, folder / rng_file(rank))


def finalize(ckpt_root: Path, step: int, state: dict, cfg) -> Path:
    """Rank 0: write state.json + config, rename the tmp folder into place, point ``latest`` at it."""
    ckpt_root = Path(ckpt_root)
    tmp = tmp_dir(ckpt_root, step)
    write_text(tmp / STATE_FILE, json.dumps(state, indent=2))
    write_text(tmp / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    final = ckpt_root / checkpoint_name(step)
    if final.exists() or final.is_symlink():
        kept = discard(final).kept  # a link goes, never what it points to; a file of the user's inside stays
        if kept:
            raise InputError(f"{final}: holds files gsdistill did not write ({', '.join(kept[:3])}); the checkpoint "
                             f"of step {step} is not written over them: move them (the checkpoint is in {tmp})")
    os.replace(tmp, final)
    latest_tmp = ckpt_root / (LATEST + ".tmp")
    write_text(latest_tmp, final.name + "\n")
    os.replace(latest_tmp, ckpt_root / LATEST)
    return final


def prune(own: list[Path], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` of ``own`` (this run's checkpoints, oldest first); return
    the ones kept. Only the run's own history counts: a checkpoint another run left in the same
    folder is never deleted, nor mistaken for a newer one (``keep <= 0`` keeps everything)."""
    if keep <= 0 or len(own) <= keep:
        return list(own)
    for old in own[:-keep]:
        discard(old)  # what gsdistill wrote there: never through a link, never a file of the user's
    return list(own[-keep:])


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder from a run dir, a ``checkpoints/`` dir or a checkpoint folder itself."""
    path = Path(path)
    for cand in (path, path / "checkpoints"):
        if (cand / MODEL_FILE).is_file():
            return cand
        if (cand / LATEST).is_file():
            named = cand / (cand / LATEST).read_text().strip()
            if not (named / MODEL_FILE).is_file():
                raise MissingFileError(f"{cand / LATEST} names {named}, which has no {MODEL_FILE}")
            return named
    raise MissingFileError(f"{path}: no checkpoint found (expected {MODEL_FILE} or checkpoints/{LATEST})")


def _check_safetensors(path: Path) -> dict:
    """Header and size of a safetensors file agree (a truncated copy fails), without loading it;
    returns the header (``{name: {"dtype", "shape", "data_offsets"}}``)."""
    if not path.is_file():
        raise MissingFileError(f"{path}: missing")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CorruptFileError(f"{path}: truncated ({size} bytes, no safetensors header)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CorruptFileError(f"{path}: truncated ({size} bytes, header alone says {n + 8})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise corrupt(path, e, "safetensors") from None
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if size != 8 + n + end:
        raise CorruptFileError(f"{path}: truncated or padded ({size} bytes, its header says {8 + n + end})")
    return header


def verify(ckpt: Path) -> None:
    """Raise a GsdistillError naming the first missing or unreadable file of checkpoint ``ckpt``."""
    ckpt = Path(ckpt)
    _check_safetensors(ckpt / MODEL_FILE)
    read_state(ckpt)
    for name in (OPTIM_FILE, *(p.name for p in ckpt.glob("rng-rank*.pt"))):
        if (ckpt / name).is_file():
            try:
                zipfile.ZipFile(ckpt / name).close()  # torch.save's zip: a truncated copy has no index
            except (zipfile.BadZipFile, OSError) as e:
                raise corrupt(ckpt / name, e, "torch") from None
    if not (ckpt / "config.yaml").is_file():
        raise MissingFileError(f"{ckpt / 'config.yaml'}: missing")


def find_resumable(path: str | os.PathLike) -> tuple[Path, list[str]]:
    """The checkpoint to resume from, and a note per damaged checkpoint skipped on the way.

    A run (or ``checkpoints/``) dir whose ``latest`` checkpoint is damaged falls back to its newest
    intact older one. A checkpoint folder named explicitly must itself be intact: the error names
    the damaged file and the newest intact checkpoint before it."""
    path = Path(path)
    if (path / MODEL_FILE).is_file() or (step_of(path) is not None and path.is_dir()):
        try:
            verify(path)
            return path, []
        except GsdistillError as e:
            raise type(e)(f"{e}{intact_hint(path)}") from None
    root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    notes: list[str] = []
    try:
        first = [resolve_checkpoint(path)]
    except MissingFileError as e:
        if not checkpoints_in(root):
            raise
        notes.append(str(e))
        first = []
    newest = step_of(first[0]) if first and step_of(first[0]) is not None else None
    candidates = first + [p for p in reversed(checkpoints_in(root))
                          if p not in first and (newest is None or step_of(p) < newest)]
    for cand in candidates:
        try:
            verify(cand)
            return cand, notes
        except GsdistillError as e:
            notes.append(f"skipped {cand}: {e}")
    raise MissingFileError(f"{path}: no intact checkpoint ({'; '.join(notes) or 'none found'})")


def _intact(ckpt: Path) -> bool:
    try:
        verify(ckpt)
        return True
    except GsdistillError:
        return False


def intact_hint(ckpt: Path) -> str:
    """``"; the newest intact checkpoint before it is ..."`` for an error about a damaged ``ckpt``."""
    older = [p for p in reversed(checkpoints_in(Path(ckpt).parent))
             if (step_of(p) or 0) < (step_of(ckpt) or 0) and _intact(p)]
    return f"; the newest intact checkpoint before it is {older[0]}" if older else ""


def read_state(ckpt: Path) -> dict:
    path = Path(ckpt) / STATE_FILE
    if not path.is_file():
        raise MissingFileError(f"{path}: missing")
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise corrupt(path, e, "JSON") from None


def read_model(ckpt: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    path = Path(ckpt) / MODEL_FILE
    if not path.is_file():
        raise MissingFileError(f"{path}: missing")
    try:
        return load_file(str(path), device=str(device))
    except Exception as e:  # safetensors' own error type (SafetensorError) names no path
        raise corrupt(path, e, "safetensors") from None


def _torch_load(path: Path):
    if not path.is_file():
        raise MissingFileError(f"{path}: missing; was the checkpoint written by a run with more ranks?")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError, zipfile.BadZipFile) as e:
        raise corrupt(path, e, "torch") from None


def read_optimizer(ckpt: Path) -> dict:
    return _torch_load(Path(ckpt) / OPTIM_FILE)


def read_rng(ckpt: Path, rank: int) -> dict:
    return _torch_load(Path(ckpt) / rng_file(rank))


def restore_rng(ckpt: Path, rank: int) -> None:
    rng = read_rng(ckpt, rank)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def _check_fit(model: torch.nn.Module, shapes: dict[str, tuple], source: Path) -> None:
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing, unexpected = sorted(set(own) - set(shapes)), sorted(set(shapes) - set(own))
    bad = [f"{k}: file {shape} vs model {own[k]}" for k, shape in shapes.items() if k in own and own[k] != shape]
    if missing or unexpected or bad:
        raise InputError(f"{source}: does not fit the configured model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}, shape mismatches {bad[:5]}")


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """Strict load with a message naming the file when the architecture differs."""
    _check_fit(model, {k: tuple(v.shape) for k, v in state.items()}, source)
    model.load_state_dict(state)


def check_model_fits(model: torch.nn.Module, ckpt: Path) -> None:
    """``load_model_state``'s check from the file's header alone (nothing loaded): a resume whose
    model does not fit is refused before any data is prepared."""
    path = Path(ckpt) / MODEL_FILE
    header = _check_safetensors(path)
    _check_fit(model, {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}, path)


def load_pretrained(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """The GSDistill model of a run dir or checkpoint folder, in eval mode
    (:class:`gsdistill.models.gsdistill_model.GSDistill`: ``embed_pages``, ``embed_text_sem``, ...)."""
    from gsdistill.models.gsdistill_model import GSDistill

    ckpt = resolve_checkpoint(path)
    cfg = read_config(ckpt)
    model = GSDistill(cfg)
    load_model_state(model, read_model(ckpt), ckpt / MODEL_FILE)
    return model.to(device).eval()


def read_config(ckpt: Path, stage: str = "pretrain"):
    """The resolved run config saved in a checkpoint folder (of a ``stage``: pretrain, retriever), on
    top of today's defaults: a key added since the checkpoint was written takes its default (which
    keeps the old behaviour), so older checkpoints still load; a key that no longer exists is a
    ``ConfigError`` naming the file."""
    from gsdistill.config import load_config
    path = Path(ckpt) / "config.yaml"
    if not path.is_file():
        raise MissingFileError(f"{path}: missing; a {stage} checkpoint keeps its run's config there")
    try:
        OmegaConf.load(path)
    except Exception as e:  # yaml / omegaconf parse errors name no file
        raise corrupt(path, e, "YAML") from None
    return load_config(stage, base=path)
