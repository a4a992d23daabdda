"""The one logging and plotting layer of every stage: CSV + TensorBoard rows, PNG line and bar plots.

``RunLog(run_dir)`` appends one row per logged step to ``metrics.csv`` and, with ``tensorboard``, its
numeric values to ``tb/`` under ``train/<key>``; a resumed run keeps the rows up to the resumed step
and drops later ones (the interrupted run's unsaved tail), so its CSV reads like an uninterrupted
one. ``write_rows`` / ``append_row`` / ``read_rows`` are the plain CSV tables (result tables that
grow run by run). ``line_plot`` draws panels of lines (with error bars and dotted reference lines),
``bar_plot`` horizontal bars with error bars; both write a PNG with the Agg backend and return its
path. ``plot_training`` draws a training run's loss terms and gradient norm from its CSV.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

CSV_NAME = "metrics.csv"


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a CSV as dicts of strings (keys stripped of padding, as Ultralytics pads them)."""
    with Path(path).open(newline="") as f:
        return [{k.strip(): v for k, v in r.items()} for r in csv.DictReader(f)]


def write_rows(path: str | Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    """A CSV with a header (``columns``, default the first row's keys) and ``rows``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns or list(rows[0] if rows else {}), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def append_row(path: str | Path, row: dict, columns: list[str]) -> None:
    """Append one row to a CSV, writing the header first when the file is new (a table that grows
    run by run and survives an interrupted sweep)."""
    path = Path(path)
    new = not path.is_file() or path.stat().st_size == 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow(row)


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class RunLog:
    """``log(step, values)`` -> a CSV row (columns fixed by the first row) and TensorBoard scalars
    (``csv_name=None``: TensorBoard only, for trainers that write their own CSV)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, resume_step: int | None = None,
                 csv_name: str | None = CSV_NAME, tb_dir: str = "tb", prefix: str = "train/"):
        self.path, self.prefix = (Path(run_dir) / csv_name if csv_name else None), prefix
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self.columns: list[str] | None = None
        if self.path is not None and resume_step is not None and self.path.is_file():
            rows = read_rows(self.path)
            self.columns = list(rows[0].keys()) if rows else None
            self._rewrite([r for r in rows if int(float(r["step"])) <= resume_step])
        elif self.path is not None and (self.path.exists() or self.path.is_symlink()):
            from gsdistill.output_removal import discard
            discard(self.path)  # a link goes, never what it points to
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(Path(run_dir) / tb_dir))

    def _rewrite(self, rows: list[dict]) -> None:
        if self.columns:
            write_rows(self.path, rows, self.columns)

    def log(self, step: int, values: dict) -> None:
        row = {"step": step, **values}
        if self.path is not None:
            if self.columns is None:
                self.columns = list(row)
                self._rewrite([])
            append_row(self.path, row, self.columns)
        if self.tb is not None:
            for key, value in values.items():
                number = _number(value)
                if number is not None:  # text columns (a loss name) stay in the CSV only
                    self.tb.add_scalar(f"{self.prefix}{key}", number, step)

    def flush(self) -> None:
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


@dataclass
class Line:
    label: str
    x: list[float]
    y: list[float]
    err: list[float] | None = None  # symmetric error bars
    marker: str | None = None
    color: str | None = None
    style: str = "-"


@dataclass
class Panel:
    title: str = ""
    lines: list[Line] = field(default_factory=list)
    xlabel: str = "step"
    ylabel: str = ""
    hlines: dict[str, float] = field(default_factory=dict)  # label -> y of a dotted reference line


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, plt, path: str | Path, dpi: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def line_plot(path: str | Path, panels: list[Panel], panel_size: tuple[float, float] = (5.0, 3.2),
              dpi: int = 100, grid: bool = False) -> Path:
    """One row of panels, each with its lines; a legend wherever a panel has a labelled line."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(panel_size[0] * len(panels), panel_size[1]), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for line in panel.lines:
            if line.err is not None:
                ax.errorbar(line.x, line.y, yerr=line.err, marker=line.marker or "o", capsize=3, label=line.label,
                            color=line.color, linestyle=line.style)
            else:
                ax.plot(line.x, line.y, marker=line.marker, label=line.label, color=line.color, linestyle=line.style)
        for label, y in panel.hlines.items():
            ax.axhline(y, color="grey", linewidth=0.8, linestyle=":", label=label)
        ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel)
        if grid:
            ax.grid(alpha=0.3)
        if any(line.label for line in panel.lines) or panel.hlines:
            ax.legend(fontsize=7)
    return _save(fig, plt, path, dpi)


def bar_plot(path: str | Path, labels: list[str], columns: dict[str, tuple[list[float], list[float] | None]],
             dpi: int = 120) -> Path:
    """Horizontal bars, one panel per column ``title -> (values, errors or None)``, rows ``labels``
    top to bottom (NaN values are left blank)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(columns), figsize=(5.5 * len(columns), 0.45 * len(labels) + 1.8),
                             sharey=True, squeeze=False)
    y = list(range(len(labels)))
    for ax, (title, (values, errors)) in zip(axes[0], columns.items()):
        vals = [0.0 if math.isnan(v) else v for v in values]
        errs = None if errors is None else [0.0 if math.isnan(e) else e for e in errors]
        ax.barh(y, vals, xerr=errs, color="C0", capsize=3)
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(y)
    axes[0][0].set_yticklabels(labels, fontsize=7)
    axes[0][0].invert_yaxis()
    return _save(fig, plt, path, dpi)


def plot_training(csv_path: str | Path, out_dir: str | Path, terms: tuple[str, ...]) -> list[Path]:
    """``loss_terms.png`` (one panel per logged term of ``terms``) and ``grad_norm.png`` of a
    training ``metrics.csv`` (paper 003 Fig. A1/A2); [] when it has no rows."""
    rows = read_rows(csv_path)
    if not rows:
        return []
    steps = [int(float(r["step"])) for r in rows]
    panels = [Panel(term, [Line("", steps, [float(r[term]) for r in rows])]) for term in terms if term in rows[0]]
    out = [line_plot(Path(out_dir) / "loss_terms.png", panels, panel_size=(3.2, 3.0))]
    if "grad_norm" in rows[0]:
        norms = [float(r["grad_norm"]) for r in rows]
        out.append(line_plot(Path(out_dir) / "grad_norm.png",
                             [Panel("", [Line("", steps, norms)], ylabel="global grad norm (before clipping)")],
                             panel_size=(5.0, 3.0)))
    return out
