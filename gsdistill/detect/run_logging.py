"""Run logging around Ultralytics' trainer: parameter counts, TensorBoard scalars, a PNG of the curves.

Ultralytics already writes ``results.csv`` (one row per epoch) and shows progress bars; these
callbacks add what it leaves to optional integrations, without touching its global settings.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path


def _write_params(trainer, run_dir: Path) -> None:
    # counted on the trainer's own model after it applied freeze=: what the optimizer really updates
    params = list(trainer.model.parameters())
    info = {"params_total": sum(p.numel() for p in params),
            "params_trainable": sum(p.numel() for p in params if p.requires_grad),
            "freeze": trainer.args.freeze}
    (run_dir / "params.json").write_text(json.dumps(info, indent=1))


def plot_results(results_csv: Path, out_png: Path) -> Path | None:
    """Loss and mAP curves of an Ultralytics ``results.csv``; None when it has no rows yet."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(results_csv) as f:
        rows = [{k.strip(): v for k, v in r.items()} for r in csv.DictReader(f)]
    if not rows:
        return None
    epochs = [float(r["epoch"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for key in [k for k in rows[0] if k.startswith(("train/", "val/"))]:
        axes[0].plot(epochs, [float(r[key]) for r in rows], label=key)
    for key in [k for k in rows[0] if k.startswith("metrics/mAP")]:
        axes[1].plot(epochs, [float(r[key]) for r in rows], marker="o", label=key)
    axes[0].set(xlabel="epoch", title="losses")
    axes[1].set(xlabel="epoch", title="validation mAP")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def add_run_callbacks(model, run_dir: Path) -> None:
    """Attach the gsdistill callbacks to an Ultralytics ``YOLO`` before ``train()``."""
    state: dict = {}

    def on_train_start(trainer):
        _write_params(trainer, run_dir)

    def on_fit_epoch_end(trainer):
        from torch.utils.tensorboard import SummaryWriter
        writer = state.setdefault("tb", SummaryWriter(str(run_dir / "tensorboard")))
        scalars = {**trainer.label_loss_items(trainer.tloss, prefix="train"), **(trainer.metrics or {})}
        for key, value in scalars.items():
            writer.add_scalar(key, float(value), trainer.epoch + 1)
        writer.flush()

    def on_train_end(trainer):
        if "tb" in state:
            state.pop("tb").close()
        results = Path(trainer.save_dir) / "results.csv"
        if results.is_file():
            plot_results(results, run_dir / "plots" / "training.png")

    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_fit_epoch_end", on_fit_epoch_end)
    model.add_callback("on_train_end", on_train_end)
