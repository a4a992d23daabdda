"""Training logs: ``metrics.csv`` (one row per logged step), TensorBoard scalars, PNG plots at the end.

On resume the CSV keeps its rows up to the resumed step and drops later ones (they belong to the
interrupted run's unsaved tail), so a resumed run's CSV reads like an uninterrupted one.
"""
from __future__ import annotations

import csv
from pathlib import Path

CSV_NAME = "metrics.csv"


class MetricsLog:
    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None):
        self.path = Path(run_dir) / CSV_NAME
        self.columns: list[str] | None = None
        if resume_step is not None and self.path.is_file():
            rows = read_metrics(self.path)
            keep = [r for r in rows if int(float(r["step"])) <= resume_step]
            self.columns = list(rows[0].keys()) if rows else None
            self._rewrite(keep)
        elif self.path.exists():
            self.path.unlink()
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(Path(run_dir) / "tb"))

    def _rewrite(self, rows: list[dict]) -> None:
        if not self.columns:
            return
        with self.path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(rows)

    def log(self, step: int, values: dict[str, float]) -> None:
        row = {"step": step, **values}
        if self.columns is None:
            self.columns = list(row)
            self._rewrite([])
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore").writerow(row)
        if self.tb is not None:
            for key, value in values.items():
                self.tb.add_scalar(f"train/{key}", value, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: Path) -> list[dict]:
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


LOSS_TERMS = ("total", "sem", "geom", "joint", "distill", "ibot", "koleo")


def plot_metrics(csv_path: Path, out_dir: Path) -> list[Path]:
    """``loss_terms.png`` (one panel per term) and ``grad_norm.png`` (paper 003 Fig. A1/A2)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(csv_path)
    if not rows:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = [int(float(r["step"])) for r in rows]
    terms = [t for t in LOSS_TERMS if t in rows[0]]
    fig, axes = plt.subplots(1, len(terms), figsize=(3.2 * len(terms), 3), squeeze=False)
    for ax, term in zip(axes[0], terms):
        ax.plot(steps, [float(r[term]) for r in rows])
        ax.set_title(term)
        ax.set_xlabel("step")
    fig.tight_layout()
    paths = [out_dir / "loss_terms.png", out_dir / "grad_norm.png"]
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(steps, [float(r["grad_norm"]) for r in rows])
    ax.set_xlabel("step")
    ax.set_ylabel("global grad norm (before clipping)")
    fig.tight_layout()
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)
    return paths
