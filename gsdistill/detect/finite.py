"""NaN / inf in detection weights and losses: refused when a detector is built or loaded, and a stop
(no checkpoint written from it) when head training produces one.

Ultralytics trains through a non-finite loss (it only warns in the first epoch) and its checkpoint
writer replaces NaN by 0 (``nan_to_num_``), so a run on a NaN backbone used to end with exit code 0
and a ``best.pt`` that loads and predicts like a trained model. These checks make it one line instead.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gsdistill.errors import InputError, TrainingDiverged


def nonfinite_tensors(module: torch.nn.Module) -> tuple[list[str], int]:
    """(names of the floating-point parameters / buffers holding NaN or inf, count of all of them)."""
    tensors = [(k, v) for k, v in module.state_dict().items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return [k for k, v in tensors if not torch.isfinite(v).all()], len(tensors)


def _summary(bad: list[str], total: int) -> str:
    return f"{len(bad)} of {total} weight tensors hold NaN/inf (e.g. {', '.join(bad[:3])})"


def check_finite_backbone(vit: torch.nn.Module, folder: str | Path) -> None:
    """InputError naming the exported backbone ``folder`` when its weights are not all finite."""
    bad, total = nonfinite_tensors(vit)
    if bad:
        raise InputError(f"{folder}: backbone {_summary(bad, total)}; a detector on it trains on NaN: export the "
                         "backbone again from a checkpoint saved before the pretraining run diverged")


def check_finite_detector(det_model: torch.nn.Module, path: str | Path) -> None:
    """InputError naming the detector file ``path`` when its weights are not all finite."""
    bad, total = nonfinite_tensors(det_model)
    if bad:
        raise InputError(f"{path}: detector {_summary(bad, total)}; it cannot be trained or evaluated: export it "
                         "again from a finite backbone (gsdistill detect export)")


def add_divergence_guard(model, run_dir: Path) -> None:
    """Stop training (:class:`TrainingDiverged`) at the first non-finite loss, and at the end of an epoch
    whose weights are no longer finite: both before Ultralytics writes a checkpoint of that state
    (it validates and saves after ``on_train_epoch_end``), so no ``best.pt`` comes from a diverged model."""
    state = {"batch": 0}

    def last_good(trainer) -> str:
        last = Path(trainer.last)
        return f"last good checkpoint: {last}" if last.is_file() else "no checkpoint was written"

    def on_train_epoch_start(_trainer) -> None:
        state["batch"] = 0

    def on_train_batch_end(trainer) -> None:
        state["batch"] += 1
        loss = trainer.loss
        if loss is not None and not bool(torch.isfinite(loss.detach()).all()):
            raise TrainingDiverged(
                f"{run_dir}: training loss is {float(loss.detach().sum())} at epoch {trainer.epoch + 1} batch "
                f"{state['batch']}; stopped ({last_good(trainer)}): check the backbone and data, or lower lr0")

    def on_train_epoch_end(trainer) -> None:
        bad, total = nonfinite_tensors(trainer.model)
        if not bad and trainer.ema is not None:
            bad, total = nonfinite_tensors(trainer.ema.ema)
        if bad:
            raise TrainingDiverged(f"{run_dir}: after epoch {trainer.epoch + 1} {_summary(bad, total)}; stopped "
                                   f"({last_good(trainer)}): lower lr0")

    model.add_callback("on_train_epoch_start", on_train_epoch_start)
    model.add_callback("on_train_batch_end", on_train_batch_end)
    model.add_callback("on_train_epoch_end", on_train_epoch_end)
