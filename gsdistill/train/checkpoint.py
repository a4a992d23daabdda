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
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

MODEL_FILE, OPTIM_FILE, STATE_FILE, LATEST = "model.safetensors", "optimizer.pt", "state.json", "latest"


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def tmp_dir(ckpt_root: Path, step: int) -> Path:
    """The folder a checkpoint is assembled in (every rank writes its own RNG file there)."""
    path = Path(ckpt_root) / f".tmp-{checkpoint_name(step)}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_model(folder: Path, state: dict[str, torch.Tensor]) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(folder / MODEL_FILE))


def write_rng(folder: Path, rank: int) -> None:
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, folder / f"rng-rank{rank}.pt")


def finalize(ckpt_root: Path, step: int, state: dict, cfg, keep: int) -> Path:
    """Rank 0: write state.json + config, rename the tmp folder into place, point ``latest`` at it, prune."""
    ckpt_root = Path(ckpt_root)
    tmp = tmp_dir(ckpt_root, step)
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
    (tmp / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    final = ckpt_root / checkpoint_name(step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = ckpt_root / (LATEST + ".tmp")
    latest_tmp.write_text(final.name + "\n")
    os.replace(latest_tmp, ckpt_root / LATEST)
    if keep > 0:
        done = sorted(p for p in ckpt_root.glob("step-*") if p.is_dir())
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint folder from a run dir, a ``checkpoints/`` dir or a checkpoint folder itself."""
    path = Path(path)
    for cand in (path, path / "checkpoints"):
        if (cand / MODEL_FILE).is_file():
            return cand
        if (cand / LATEST).is_file():
            named = cand / (cand / LATEST).read_text().strip()
            if not (named / MODEL_FILE).is_file():
                raise FileNotFoundError(f"{cand / LATEST} names {named}, which has no {MODEL_FILE}")
            return named
    raise FileNotFoundError(f"{path}: no checkpoint found (expected {MODEL_FILE} or checkpoints/{LATEST})")


def read_state(ckpt: Path) -> dict:
    return json.loads((Path(ckpt) / STATE_FILE).read_text())


def read_model(ckpt: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    return load_file(str(Path(ckpt) / MODEL_FILE), device=str(device))


def read_optimizer(ckpt: Path) -> dict:
    return torch.load(Path(ckpt) / OPTIM_FILE, map_location="cpu", weights_only=True)


def restore_rng(ckpt: Path, rank: int) -> None:
    path = Path(ckpt) / f"rng-rank{rank}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; was the checkpoint written by a run with more ranks?")
    rng = torch.load(path, map_location="cpu", weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """Strict load with a message naming the file when the architecture differs."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    bad = [f"{k}: file {tuple(v.shape)} vs model {tuple(own[k].shape)}"
           for k, v in state.items() if k in own and own[k].shape != v.shape]
    if missing or unexpected or bad:
        raise ValueError(f"{source}: does not fit the configured model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}, shape mismatches {bad[:5]}")
    model.load_state_dict(state)


def load_pretrained(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """The GSDistill model of a run dir or checkpoint folder, in eval mode (INTERFACES §3)."""
    from gsdistill.models.gsdistill_model import GSDistill

    ckpt = resolve_checkpoint(path)
    cfg = OmegaConf.load(ckpt / "config.yaml")
    model = GSDistill(cfg)
    load_model_state(model, read_model(ckpt), ckpt / MODEL_FILE)
    return model.to(device).eval()
