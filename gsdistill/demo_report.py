"""``report.md`` of ``gsdistill demo``: data, pretraining curves, detection mAP, retrieval per k.

Paths in the report are relative to the report, so the run folder can be moved or zipped whole.
"""
from __future__ import annotations

import os
from pathlib import Path

from gsdistill.train.metrics_log import LOSS_TERMS, read_metrics


def _rel(path: str | Path, out: Path) -> str:
    return os.path.relpath(Path(path).resolve(), out.resolve())


def _fmt(v) -> str:
    return "–" if v is None else f"{100 * float(v):.2f}"


def loss_table(metrics_csv: Path) -> tuple[str, dict]:
    """First vs last logged value of every loss term (and the fall, which the demo test checks)."""
    rows = read_metrics(metrics_csv)
    terms = [t for t in LOSS_TERMS if t in rows[0]]
    first, last = rows[0], rows[-1]
    change = {t: (float(first[t]), float(last[t])) for t in terms}
    lines = [f"| term | step {first['step']} | step {last['step']} | change |", "|---|---:|---:|---:|"]
    lines += [f"| {t} | {a:.4f} | {b:.4f} | {b - a:+.4f} |" for t, (a, b) in change.items()]
    return "\n".join(lines), change


def data_section(info: dict) -> list[str]:
    out = ["## 1. Page tuples", ""]
    for split, m in info.items():
        if not isinstance(m, dict) or "pages" not in m:
            continue
        classes = ", ".join(f"{k} {v}" for k, v in sorted(m["boxes_per_class"].items()))
        out.append(f"- **{split}**: {m['pages']} pages from {m['documents']} documents, {m['spans']} text spans; "
                   f"boxes: {classes}; skipped inputs: {m['skipped_count']} {m.get('skip_reasons') or ''}")
    return out + [""]


def detect_section(det: dict, out: Path) -> list[str]:
    lines = ["## 3. Layout detection (frozen backbone, head-only YOLOv10)", "",
             f"Parameters: {det['params_total']:,} total, {det['params_trainable']:,} trainable "
             f"(the ViT backbone is frozen).", "",
             "| metric | Ultralytics | pycocotools |", "|---|---:|---:|",
             f"| mAP@50 (%) | {_fmt(det['mAP50'])} | {_fmt(det['coco_mAP50'])} |",
             f"| mAP@[50:95] (%) | {_fmt(det['mAP50-95'])} | {_fmt(det['coco_mAP50-95'])} |", "",
             "| class | AP@50 | AP@[50:95] |", "|---|---:|---:|"]
    for name, ap in det["per_class"].items():
        lines.append(f"| {name} | {_fmt(ap.get('AP50'))} | {_fmt(ap.get('AP50-95'))} |")
    lines += ["", "Held-out pages with predicted boxes:", ""]
    lines += [f"![prediction]({_rel(p, out)})" for p in det.get("predictions", [])]
    return lines + [""]


def write_demo_report(cfg, out: Path, run_dir: Path, info: dict, times: dict) -> Path:
    from gsdistill.retrieval.page_report import markdown_table

    table, _ = loss_table(run_dir / "metrics.csv")
    plots = sorted((run_dir / "plots").glob("*.png")) if (run_dir / "plots").is_dir() else []
    ret = info["retrieval"]
    lines = ["# gsdistill demo report", "",
             f"Source: {'PDFs in ' + str(cfg.pdfs) if cfg.pdfs else 'embedded synthetic pages'}; seed {cfg.seed}; "
             f"stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()) + ".", ""]
    lines += data_section(info["data"])
    lines += ["## 2. GSDistill pretraining", "", f"Run: `{_rel(run_dir, out)}` (resolved config in "
              f"`config.yaml`, metrics in `metrics.csv`, backbone export in `backbone/`).", "", table, ""]
    lines += [f"![{p.stem}]({_rel(p, out)})" for p in plots] + [""]
    lines += detect_section(info["detect"], out)
    lines += ["## 4. Crop-subsampled page retrieval (held-out pages)", "", markdown_table({"pretrained (full objective)": ret["results"]}), "",
              f"![accuracy vs k]({_rel(ret['files']['plot'], out)})", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
