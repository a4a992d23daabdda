"""Held-out head-only detection against pretraining minutes: one pretraining run, several checkpoints.

Issue 34 asks what the pretraining time buys: this exports the student backbone of each named
checkpoint of a run (``gsdistill export``), trains the same head-only detector on each (the
detect_sweep set-up, ``pretrained[step<N>]``), and writes ``OUT/curve.csv`` and ``OUT/curve.png``:
held-out mAP@50 and mAP@[50:95] against the pretraining minutes the run had spent up to that step
(the sum of its logged ``step_s``), with the random twin's mAP@50 (``--random-rows``, a rows.json of
``tools/experiments/detect_sweep.py`` with the same detect set-up) as the line to beat. A checkpoint whose
detector was trained before (its ``rows.json`` exists) is not trained again.

    python tools/experiments/checkpoint_curve.py --run RUN --data DATA_YAML --out OUT --steps 300,600,900 \\
        [--random-rows SWEEP/rows.json] [imgsz=320 epochs=12 ...]

The checkpoints of one run share its learning-rate schedule (cosine over ``optim.steps``), so step N
of a longer run is not a run of N steps; the curve says what more steps of that run bought.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gsdistill.config import load_config  # noqa: E402
from gsdistill.detect.compare import compare_backbones  # noqa: E402
from gsdistill.pretrain.metrics_log import read_metrics  # noqa: E402


def minutes_at(run: Path) -> dict[int, float]:
    """Logged step -> pretraining minutes spent up to it (each row's ``step_s`` is the mean step time of
    the ``train.log_every`` steps it closes)."""
    every = int(load_config("pretrain", run / "config.yaml").train.log_every)
    out, total, last = {}, 0.0, 0
    for row in read_metrics(run / "metrics.csv"):
        step = int(float(row["step"]))
        total += float(row["step_s"]) * (step - last if last else every)
        out[step], last = total / 60, step
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", required=True, help="comma-separated checkpoint steps")
    parser.add_argument("--random-rows", type=Path, help="rows.json holding the random twin's row (random[...])")
    parser.add_argument("overrides", nargs="*", help="detect key=value overrides")
    args = parser.parse_args()
    from gsdistill.cli import main as cli_main

    cfg = load_config("detect", "compare", list(args.overrides))
    minutes, points = minutes_at(args.run), []
    for step in [int(s) for s in args.steps.split(",")]:
        folder = args.out / f"step{step}"
        rows_file = folder / "rows.json"
        if not rows_file.is_file():
            backbone = args.out / "backbones" / f"step{step}"
            if not (backbone / "backbone.json").is_file():
                cli_main(["export", str(args.run / "checkpoints" / f"step-{step:06d}"), str(backbone)])
            compare_backbones(args.data, {f"pretrained[step{step}]": str(backbone)}, seeds=[0], cfg=cfg, out_dir=folder)
        row = json.loads(rows_file.read_text())[0]
        points.append({"step": step, "pretrain_minutes": round(minutes[step], 2), "map50": row["map50"],
                       "map50_95": row["map50_95"]})
    random_map = None
    if args.random_rows:
        random_map = next(r["map50"] for r in json.loads(args.random_rows.read_text()) if r["backbone"].startswith("random"))
    with open(args.out / "curve.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(points[0]))
        writer.writeheader()
        writer.writerows(points)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    x = [p["pretrain_minutes"] for p in points]
    ax.plot(x, [100 * p["map50"] for p in points], "o-", label="pretrained, mAP@50")
    ax.plot(x, [100 * p["map50_95"] for p in points], "s--", label="pretrained, mAP@[50:95]")
    for p in points:
        ax.annotate(f"{p['step']}", (p["pretrain_minutes"], 100 * p["map50"]), textcoords="offset points", xytext=(0, 5),
                    fontsize=7, ha="center")
    if random_map is not None:
        ax.axhline(100 * random_map, color="grey", linestyle=":", label="random twin, mAP@50")
    ax.set_xlabel("pretraining minutes (steps annotated)")
    ax.set_ylabel("held-out mAP (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "curve.png", dpi=120)
    print(json.dumps(points, indent=1))


if __name__ == "__main__":
    main()
