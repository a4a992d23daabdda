"""Every part of a checkpoint checked against what it is loaded into, before anything is loaded.

``verify`` (:mod:`gsdistill.pretrain.checkpoint`) finds damaged files; this finds intact files that
do not belong: an ``optimizer.pt`` of another run (another depth or width: torch's fused AdamW
crashed the process on it, the per-tensor one raised a ValueError deep inside), an RNG file that
is not a torch RNG state, a ``state.json`` whose step is not its folder's. Each is one
:class:`~gsdistill.errors.InputError` naming the file (exit 2 from the command).
"""
from __future__ import annotations

from pathlib import Path

import torch

from gsdistill.errors import InputError
from gsdistill.pretrain import checkpoint


def _unfit(path: Path, why: str) -> InputError:
    return InputError(f"{path}: {why}; it does not belong to this model's optimizer (a file of another run "
                      "or model?): resume from the run's own checkpoint, or start a new run")


def optimizer_state(saved) -> dict | None:
    """The torch optimizer ``state_dict`` inside an ``optimizer.pt`` (the pretraining engine saves it
    as is; the retriever engine under the key ``optimizer``)."""
    if isinstance(saved, dict) and "param_groups" not in saved and isinstance(saved.get("optimizer"), dict):
        saved = saved["optimizer"]
    return saved if isinstance(saved, dict) else None


def check_optimizer_state(saved, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """``saved`` (a ``state_dict``) fits ``optimizer``: as many groups, as many parameters in each,
    group options this optimizer knows, and per parameter state tensors of its shape and dtype,
    finite, with a scalar step."""
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict) \
            or not isinstance(saved.get("param_groups"), list):
        raise _unfit(path, "not an optimizer state (no state and param_groups)")
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        raise _unfit(path, f"{len(saved['param_groups'])} parameter group(s), the optimizer has {len(groups)}")
    params: dict = {}
    for i, (old, new) in enumerate(zip(saved["param_groups"], groups)):
        ids = old.get("params") if isinstance(old, dict) else None
        if not isinstance(ids, list) or len(ids) != len(new["params"]):
            n = len(ids) if isinstance(ids, list) else "no"
            raise _unfit(path, f"group {i} holds {n} parameters, the optimizer's {len(new['params'])}")
        unknown = sorted(set(old) - set(new))
        if unknown:
            raise _unfit(path, f"group {i} has options {unknown} this optimizer ({type(optimizer).__name__}) "
                               "does not know")
        params.update(zip(ids, new["params"]))
    for idx, entry in saved["state"].items():
        if idx not in params or not isinstance(entry, dict):
            raise _unfit(path, f"state of parameter {idx!r}, which no group lists")
        param = params[idx]
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                continue
            where = f"{key} of parameter {idx}"
            if key == "step":
                if value.numel() != 1 or not torch.isfinite(value.double()).all():
                    raise _unfit(path, f"{where} is not a finite count")
                continue
            if value.shape != param.shape:
                raise _unfit(path, f"{where} has shape {tuple(value.shape)}, the parameter {tuple(param.shape)}")
            if value.dtype != param.dtype:
                raise _unfit(path, f"{where} is {value.dtype}, the parameter {param.dtype}")
            if not torch.isfinite(value).all():
                raise _unfit(path, f"{where} holds NaN/inf")


def check_rng(ckpt: Path, rank: int) -> None:
    """``rng-rank<r>.pt`` holds torch RNG states (``set_rng_state`` raised a bare RuntimeError)."""
    rng, path = checkpoint.read_rng(ckpt, rank), Path(ckpt) / checkpoint.rng_file(rank)
    want = torch.get_rng_state()
    ok = isinstance(rng, dict) and isinstance(rng.get("torch"), torch.Tensor) \
        and rng["torch"].dtype == want.dtype and rng["torch"].shape == want.shape \
        and (not isinstance(rng.get("cuda"), torch.Tensor) or rng["cuda"].dtype == torch.uint8)
    if not ok:
        raise InputError(f"{path}: not a torch RNG state of {tuple(want.shape)} bytes; the checkpoint is damaged "
                         "or assembled from other runs: resume from an intact checkpoint")


def check_state(ckpt: Path, state: dict) -> None:
    """``state.json``: a step that is its folder's, a data position."""
    path = Path(ckpt) / checkpoint.STATE_FILE
    step = state.get("step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise InputError(f"{path}: step {step!r} is not a step count")
    folder_step = checkpoint.step_of(Path(ckpt))
    if folder_step is not None and folder_step != step:
        raise InputError(f"{path}: says step {step}, its folder is {Path(ckpt).name}; the checkpoint was assembled "
                         "from other checkpoints: resume from an intact one")
    if not isinstance(state.get("data_position"), dict):
        raise InputError(f"{path}: no data position (data_position); the checkpoint cannot continue its data")


def check_parts(ckpt: Path, state: dict, engine, rank: int) -> None:
    """Everything a resume of ``engine`` on ``rank`` will load from ``ckpt``, checked first."""
    ckpt = Path(ckpt)
    check_state(ckpt, state)
    check_rng(ckpt, rank)
    optimizer = getattr(engine, "optimizer", None)
    if isinstance(optimizer, torch.optim.Optimizer) and (ckpt / checkpoint.OPTIM_FILE).is_file():
        check_optimizer_state(optimizer_state(checkpoint.read_optimizer(ckpt)), optimizer,
                              ckpt / checkpoint.OPTIM_FILE)
