"""Run logging around Ultralytics' trainer: parameter counts, TensorBoard scalars, a PNG of the curves
(both through the shared layer, :mod:`gsdistill.run_log`).

Ultralytics already writes ``results.csv`` (one row per epoch) and shows progress bars; these
callbacks add what it leaves to optional integrations, without touching its global settings.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from gsdistill.run_log import Line, Panel, RunLog, line_plot, read_rows


def _write_params(trainer, run_dir: Path) -> None:
    # counted on the trainer's own model after it applied freeze=: what the optimizer really updates
    params = list(trainer.model.parameters())
    info = {"params_total": sum(p.numel() for p in params),
            "params_trainable": sum(p.numel() for p in params if p.requires_grad),
            "freeze": trainer.args.freeze}
    (run_dir / "params.json").write_text(json.dumps(info, indent=1))


def plot_results(results_csv: Path, out_png: Path) -> Path | None:
    """Loss and mAP curves of an Ultralytics ``results.csv``; None when it has no rows yet."""
    rows = read_rows(results_csv)
    if not rows:
        return None
    epochs = [float(r["epoch"]) for r in rows]

    def lines(keys, marker=None):
        return [Line(k, epochs, [float(r[k]) for r in rows], marker=marker) for k in keys]

    losses = Panel("losses", lines(k for k in rows[0] if k.startswith(("train/", "val/"))), xlabel="epoch")
    maps = Panel("validation mAP", lines((k for k in rows[0] if k.startswith("metrics/mAP")), "o"), xlabel="epoch")
    return line_plot(out_png, [losses, maps], panel_size=(5.0, 4.0))


def _read_report(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        return {}


def _skipped_images(run_dir: Path) -> list[dict]:
    from gsdistill.detect.checks import skipped_images
    return skipped_images(_read_report(run_dir / "data_check.json"))


def add_run_callbacks(model, run_dir: Path) -> None:
    """Attach the gsdistill callbacks to an Ultralytics ``YOLO`` before ``train()``.

    Besides ``params.json``, TensorBoard and the curves PNG, the run dir gets ``report.json``, rewritten
    after every epoch: ``optimizer_steps`` (counted by a post-step hook on the trainer's optimizer,
    so gradient accumulation over ``nbs / batch`` batches counts once), ``steps_at_epoch`` (the count
    after each finished epoch; a resumed run starts from the count of the epoch it resumes after),
    ``imgsz``, ``batch``, ``nbs``, ``accumulate``, ``batches_per_epoch``, ``epochs_done``,
    ``train_seconds`` and the last validation ``metrics`` (after training: best.pt's, from the trainer's
    final evaluation; none per epoch with ``val_during_training=false``), and the images the data check
    skipped (``images_skipped``, ``skipped_images``: split, image and reason of each; from the run's
    ``data_check.json``), so ``train_images`` never drops without a reason beside it.
    """
    report_path = run_dir / "report.json"
    state: dict = {"steps": 0, "writer": None, "skipped": _skipped_images(run_dir)}

    def write_report(trainer) -> None:
        report = {"optimizer_steps": state["steps"], "steps_at_epoch": state["steps_at_epoch"],
                  "epochs_done": len(state["steps_at_epoch"]), "epochs": int(trainer.epochs),
                  "imgsz": int(trainer.args.imgsz), "batch": int(trainer.batch_size), "nbs": int(trainer.args.nbs),
                  "accumulate": int(state["accumulate"]), "batches_per_epoch": len(trainer.train_loader),
                  "train_images": len(trainer.train_loader.dataset), "images_skipped": len(state["skipped"]),
                  "skipped_images": state["skipped"],
                  "train_seconds": round(state["seconds_before"] + time.time() - state["t0"], 1),
                  "metrics": {k: float(v) for k, v in (trainer.metrics or {}).items()}}
        report_path.write_text(json.dumps(report, indent=1))

    def count_step(*_args, **_kwargs) -> None:
        state["steps"] += 1

    def on_train_start(trainer):
        _write_params(trainer, run_dir)
        previous = _read_report(report_path) if trainer.start_epoch > 0 else {}  # a resumed run continues the count
        done = [int(n) for n in previous.get("steps_at_epoch", [])][:trainer.start_epoch]
        state.update(steps=done[-1] if done else 0, steps_at_epoch=done, t0=time.time(),
                     seconds_before=float(previous.get("train_seconds", 0.0)) if done else 0.0,
                     accumulate=trainer.accumulate)  # nominal accumulation (warm-up ramps up to it)
        trainer.optimizer.register_step_post_hook(count_step)

    def on_fit_epoch_end(trainer):
        if state["writer"] is None:  # one writer (one event file) per run, closed at the end
            state["writer"] = RunLog(run_dir, csv_name=None, tb_dir="tensorboard", prefix="")
        scalars = {**trainer.label_loss_items(trainer.tloss, prefix="train"), **(trainer.metrics or {})}
        scalars["optimizer_steps"] = state["steps"]
        state["writer"].log(trainer.epoch + 1, {k: float(v) for k, v in scalars.items()})
        state["writer"].flush()
        if trainer.epoch < trainer.epochs:  # final_eval re-runs this at epochs + 1 to log best.pt's metrics
            state["steps_at_epoch"] = state["steps_at_epoch"][:trainer.epoch] + [state["steps"]]
        write_report(trainer)

    def close_writer(_trainer=None):
        if state["writer"] is not None:
            state.pop("writer").close()
            state["writer"] = None

    def on_train_end(trainer):
        close_writer()
        write_report(trainer)  # metrics of the final validation of best.pt
        results = Path(trainer.save_dir) / "results.csv"
        if results.is_file():
            plot_results(results, run_dir / "plots" / "training.png")

    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_fit_epoch_end", on_fit_epoch_end)
    model.add_callback("on_train_end", on_train_end)
    model.add_callback("teardown", close_writer)  # also when training stops with an exception
