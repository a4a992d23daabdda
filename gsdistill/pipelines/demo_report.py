"""``report.md`` of ``gsdistill demo``: data, pretraining curves, detection and retrieval against controls.

Paths in the report are relative to the report, so the run folder can be moved or zipped whole.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gsdistill.config import load_config
from gsdistill.pretrain.metrics_log import LOSS_TERMS, read_metrics

LEGIBLE_PX = 8  # a text line needs about this many pixels of height to be readable by a small ViT


def _rel(path: str | Path, out: Path) -> str:
    return os.path.relpath(Path(path).resolve(), out.resolve())


def loss_table(metrics_csv: Path) -> tuple[str, dict]:
    """First vs last logged value of every loss term (and the fall, which the demo test checks)."""
    rows = read_metrics(metrics_csv)
    terms = [t for t in LOSS_TERMS if t in rows[0]]
    first, last = rows[0], rows[-1]
    change = {t: (float(first[t]), float(last[t])) for t in terms}
    lines = [f"| term | step {first['step']} | step {last['step']} | change |", "|---|---:|---:|---:|"]
    lines += [f"| {t} | {a:.4f} | {b:.4f} | {b - a:+.4f} |" for t, (a, b) in change.items()]
    return "\n".join(lines), change


def text_height_in_view(pages: list[dict], view_size: int) -> dict[str, float]:
    """Median height, in pixels of a ``view_size`` whole-page view, of one-line text classes."""
    out = {}
    for cls in ("Title", "Section-header", "Page-header"):
        hs = [(s["bbox"][3] - s["bbox"][1]) * view_size / p["height"] for p in pages for s in p["spans"]
              if s.get("category") == cls]
        if hs:
            out[cls] = float(np.median(hs))
    return out


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
    from gsdistill.detect.compare import markdown_table
    summary = {s["backbone"]: s for s in det["summary"]}
    lines = ["## 3. Layout detection on held-out pages (same head, same budget)", "",
             "Head-only YOLOv10 on the frozen pretrained backbone vs on a random backbone of the same "
             "architecture, and a stock YOLOv10n with every layer trained, as a reference; trained on "
             "pretraining pages, scored by pycocotools on held-out documents; mean ± sample std over seeds.", "",
             markdown_table(det["summary"]), ""]
    pre, rnd = summary.get("pretrained"), summary.get("random backbone")
    if pre and rnd:
        gain = pre["map50_mean"] - rnd["map50_mean"]
        spread = max(s or 0.0 for s in (pre["map50_std"], rnd["map50_std"]))
        verdict = "more than" if gain > spread else "not more than"
        lines += [f"Pretrained − random: **{100 * gain:+.2f}** mAP@50 points, {verdict} the seed spread "
                  f"({100 * spread:.2f}).", ""]
    lines += [f"Held-out pages with the pretrained detector's boxes (confidence ≥ {det['predict_conf']}):", ""]
    lines += [f"![prediction]({_rel(p, out)})" for p in det.get("predictions", [])]
    return lines + [""]


def retrieval_section(ret: dict, heights: dict[str, float]) -> list[str]:
    from gsdistill.pipelines.demo_learning import paired_gain, retrieval_markdown
    size = ret["image_size"]
    legible = ", ".join(f"{k} {v:.1f} px" for k, v in heights.items())
    note = f"text in view: {legible}" if heights else None
    lines = ["## 4. Page retrieval from a page's own texts, through each head", "",
             "Query: all box-text descriptors of a page (geometric head) or k of its text spans (semantic "
             "head), from the text cache; candidates: every page image of the set at "
             f"{size} px; a page's score is the mean of its descriptors' cosines (a layout is the set of its "
             "boxes) or the log-sum-exp (T = 0.05) of its crops' cosines. Acc@1 in % with a 95% bootstrap "
             "interval over documents; chance = 1/pages.", "",
             f"Text height in the {size} px view (median, held-out pages): {legible}. Below about "
             f"{LEGIBLE_PX} px a line is not legible, so the semantic numbers measure layout cues, not reading.", "",
             "### Held-out pages (documents never seen in pretraining)", "", retrieval_markdown(ret["rows"], "held-out", note), ""]
    docs = ret["doc_ids"]["held-out"]
    for other in ("random backbone, heads trained", "random (untrained)"):
        g = paired_gain(ret["rows"], other, "pretrained", "held-out", "geom", "all", doc_of=docs)
        if g is not None:
            lines.append(f"- geometric Acc@1, pretrained − {other}: {100 * g['diff']:+.1f} points "
                         f"[{100 * g['ci95'][0]:+.1f}, {100 * g['ci95'][1]:+.1f}]")
    lines += ["", "### Training pages (what the objective fitted)", "", retrieval_markdown(ret["rows"], "training", note), ""]
    return lines


def write_demo_report(cfg, out: Path, run_dir: Path, control_dir: Path | None, info: dict, times: dict) -> Path:
    from gsdistill.tuples.shards import read_pages
    table, _ = loss_table(run_dir / "metrics.csv")
    plots = sorted((run_dir / "plots").glob("*.png")) if (run_dir / "plots").is_dir() else []
    held = list(read_pages(out / "data" / "eval", decode_images=False))
    heights = text_height_in_view(held, info["retrieval"]["image_size"])
    lines = ["# gsdistill demo report", "",
             f"Source: {'PDFs in ' + str(cfg.pdfs) if cfg.pdfs else 'embedded synthetic pages'}; seed {cfg.seed}; "
             f"stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()) + ".", ""]
    lines += data_section(info["data"])
    lines += ["## 2. GSDistill pretraining", "", f"Run: `{_rel(run_dir, out)}` (resolved config in "
              f"`config.yaml`, metrics in `metrics.csv`, backbone export in `backbone/`)."
              + (f" Control (backbone frozen at random, heads trained the same way): `{_rel(control_dir, out)}`."
                 if control_dir else ""), "", table, ""]
    ramp = int(load_config("pretrain", run_dir / "config.yaml").objective.distill_warmup_steps)
    if ramp:
        lines += [f"`total` rises over the first {ramp} steps while the self-distillation weights λ3, λ4 ramp "
                  "in from 0 (`objective.distill_warmup_steps`); the terms themselves are logged unweighted.", ""]
    lines += [f"![{p.stem}]({_rel(p, out)})" for p in plots] + [""]
    lines += detect_section(info["detect"], out)
    lines += retrieval_section(info["retrieval"], heights)
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
