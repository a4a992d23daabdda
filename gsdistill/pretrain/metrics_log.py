"""Pretraining's training log on the shared layer (:mod:`gsdistill.run_log`): ``metrics.csv``,
TensorBoard under ``tb/``, ``plots/loss_terms.png`` and ``plots/grad_norm.png`` at the end."""
from __future__ import annotations

from pathlib import Path

from gsdistill.run_log import CSV_NAME, RunLog, plot_training, read_rows

__all__ = ["CSV_NAME", "LOSS_TERMS", "MetricsLog", "plot_metrics", "read_metrics"]

MetricsLog = RunLog
read_metrics = read_rows
LOSS_TERMS = ("total", "sem", "geom", "joint", "distill", "ibot", "koleo", "patch_spread", "local_sem", "region_geom")


def plot_metrics(csv_path: Path, out_dir: Path, terms: tuple[str, ...] = LOSS_TERMS) -> list[Path]:
    """``loss_terms.png`` (one panel per term) and ``grad_norm.png`` (paper 003 Fig. A1/A2)."""
    return plot_training(csv_path, out_dir, terms)
