"""``report.md`` of ``gsdistill demo``: data, pretraining curves, detection and retrieval against controls.

Paths in the report are relative to the report, so the run folder can be moved or zipped whole.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from gsdistill.config import load_config
from gsdistill.pipelines.demo_budgets import budgets_section
from gsdistill.pipelines.demo_report_detect import detect_section, human_labels_section
from gsdistill.pipelines.demo_report_labelled import labelled_section
from gsdistill.pipelines.report_text import chance_claim, claim, rel
from gsdistill.pretrain.metrics_log import LOSS_TERMS, read_metrics

LOG_K_MARGIN = 0.1  # nats: a DINO/iBOT term closer than this to log K has a (near) uniform teacher
LEGIBLE_PX = 8  # a text line needs about this many pixels of height to be readable by a small ViT


def loss_table(metrics_csv: Path) -> tuple[str, dict]:
    """First vs last logged value of every loss term (and the fall, which the demo test checks)."""
    rows = read_metrics(metrics_csv)
    terms = [t for t in LOSS_TERMS if t in rows[0]]
    first, last = rows[0], rows[-1]
    change = {t: (float(first[t]), float(last[t])) for t in terms}
    lines = [f"| term | step {first['step']} | step {last['step']} | change |", "|---|---:|---:|---:|"]
    lines += [f"| {t} | {a:.4f} | {b:.4f} | {b - a:+.4f} |" for t, (a, b) in change.items()]
    return "\n".join(lines), change


def _one_line_heights(pages: list[dict], factor) -> dict[str, float]:
    """Median height of one-line text classes, each page's pixels scaled by ``factor(page)``."""
    out = {}
    for cls in ("Title", "Section-header", "Page-header"):
        hs = [(s["bbox"][3] - s["bbox"][1]) * factor(p) for p in pages for s in p["spans"] if s.get("category") == cls]
        if hs:
            out[cls] = float(np.median(hs))
    return out


def text_height_in_view(pages: list[dict], view_size: int) -> dict[str, float]:
    """Median height, in pixels of a ``view_size`` whole-page view, of one-line text classes."""
    return _one_line_heights(pages, lambda p: view_size / p["height"])


def area_share(scale) -> float:
    """The median area share of a random crop drawn uniformly from ``scale`` (RandomResizedCrop's range)."""
    return (float(scale[0]) + float(scale[1])) / 2


def view_page_scale(pages: list[dict], size: int, scale, span_px: float | None = None) -> float:
    """The long side, in pixels, at which a view shows the page (median over pages): comparable with the
    detector's ``imgsz``, to which it letterboxes the page's long side.

    A random crop of area share ``s`` is ``sqrt(s * w * h)`` page pixels on a side (the geometric mean of
    its sides, whatever aspect RandomResizedCrop draws) resized to ``size``; ``s`` is drawn uniformly from
    ``scale``, so its median, the midpoint, gives the median scale. A span crop is ``span_px`` page pixels
    wide."""
    s = area_share(scale)
    side = (lambda p: span_px) if span_px else (lambda p: np.sqrt(s * p["width"] * p["height"]))
    return float(np.median([size * max(p["width"], p["height"]) / side(p) for p in pages]))


def scale_against_detector(pages: list[dict], views, imgsz: int) -> str:
    """One sentence: the page's scale in pretraining's views against the detector's input (a backbone learns
    the features of the scale it is shown; docs/detection.md, "The view scale")."""
    if not pages:
        return ""
    g = view_page_scale(pages, int(views.global_size), views.global_scale)
    spans = str(views.local_mode) == "spans"
    loc = view_page_scale(pages, int(views.local_size), views.local_scale, float(views.local_span_px) if spans else None)
    share = lambda r: f"{100 * area_share(r):.0f} % of the page area"  # noqa: E731
    what = f"about {int(views.local_span_px)} page px around a text span" if spans else share(views.local_scale)
    return (f"Scale: the detectors read a page at a long side of {imgsz} px; pretraining's global views "
            f"({int(views.global_size)} px, {share(views.global_scale)}) show it at about {g:.0f} px "
            f"({g / imgsz:.2f}x the detector's scale), its local views ({int(views.local_size)} px, {what}) at about "
            f"{loc:.0f} px ({loc / imgsz:.2f}x). Features learnt at another scale than the one detected at are "
            "features of another page.")


def local_view_heights(pages: list[dict], views) -> tuple[str, dict[str, float]]:
    """What pretraining's local views show of the text: (description, median one-line heights in view px).

    ``spans`` crops are ``local_span_px`` page pixels wide, so one factor serves every page; ``random``
    crops cover ``local_scale`` of the page area (the midpoint of its range, as in :func:`view_page_scale`)."""
    size = int(views.local_size)
    if str(views.local_mode) == "spans":
        k = size / float(views.local_span_px)
        what = f"{size} px local views of about {int(views.local_span_px)} page px around a text span"
        factor = lambda p: k  # noqa: E731
    else:
        share = area_share(views.local_scale)
        what = f"{size} px local views of {100 * share:.0f} % of the page area"
        factor = lambda p: size / np.sqrt(share * p["width"] * p["height"])  # noqa: E731
    return what, _one_line_heights(pages, factor)


def data_section(info: dict) -> list[str]:
    out = ["## 1. Page tuples", ""]
    for split, m in info.items():
        if not isinstance(m, dict) or "pages" not in m:
            continue
        classes = ", ".join(f"{k} {v}" for k, v in sorted(m["boxes_per_class"].items()))
        out.append(f"- **{split}**: {m['pages']} pages from {m['documents']} documents, {m['spans']} text spans; "
                   f"boxes: {classes}; skipped inputs: {m['skipped_count']} {m.get('skip_reasons') or ''}")
    return out + [""]


def distill_verdict(change: dict, k: int, spread: dict | None = None) -> list[str]:
    """Whether DINO and iBOT left log K (a teacher whose targets stay uniform distils nothing), and the
    measured reason: how much the teacher's prototype logits differ between pages, against its temperature."""
    log_k, lines = math.log(k), []
    for term, name in (("distill", "DINO"), ("ibot", "iBOT")):
        if term not in change:
            continue
        first, last = change[term]
        below = log_k - last
        state = (f"{below:.2f} nats below log K at the end: the teacher's targets are not uniform" if below > LOG_K_MARGIN
                 else f"within {LOG_K_MARGIN} nats of log K at the end: the teacher's targets stay near uniform, "
                      "so this term distilled (almost) nothing at this budget")
        lines.append(f"- {name}: {first:.3f} → {last:.3f}, log K = {log_k:.3f} (K = {k}); {state}.")
    if spread and lines:
        lines.append(f"- The EMA teacher's DINO prototype logits on {spread['pages']} held-out whole pages differ "
                     f"between pages by {spread['std_over_pages']:.4f} (std over pages, mean over prototypes; mean "
                     f"pairwise cosine {spread['mean_pairwise_cosine']:.3f}), {spread['ratio']:.2f}x the teacher "
                     f"temperature {spread['teacher_temp']:g}: Sinkhorn-Knopp's targets are near uniform when this "
                     "ratio is well below 1, whatever the student does.")
        if "bottleneck_cosine" in spread:  # reports written before this measure lack it
            lines[-1] += (f" Where the pages merge: their pooled embeddings (the head's input) have mean pairwise cosine "
                          f"{spread['input_cosine']:.3f}, the head's bottleneck output {spread['bottleneck_cosine']:.4f}"
                          + (" (the head sends every page to about one point)." if spread["bottleneck_cosine"] > 0.999
                             else "."))
    return lines + ([""] if lines else [])


def legibility(heights: dict[str, float], size: int) -> str:
    """The measured text heights in the view and what they allow (a line needs about LEGIBLE_PX pixels)."""
    if not heights:
        return f"Text height in the {size} px view: no title, section header or page header on the held-out pages to measure."
    small = [k for k, v in heights.items() if v < LEGIBLE_PX]
    text = (f"Text height in the {size} px view (median, held-out pages): "
            + ", ".join(f"{k} {v:.1f} px" for k, v in heights.items()) + ". ")
    if len(small) == len(heights):
        return text + (f"All below about {LEGIBLE_PX} px, where a line stops being legible: the semantic numbers can "
                       "measure layout cues, not reading.")
    if small:
        return text + f"{', '.join(small)} below about {LEGIBLE_PX} px (not legible), the others at or above it."
    return text + f"All at or above about {LEGIBLE_PX} px, where a line becomes legible."


def retrieval_section(ret: dict, heights: dict[str, float], local: tuple[str, dict] | None = None) -> list[str]:
    from gsdistill.pipelines.demo_learning import paired_gain, retrieval_markdown
    size = ret["image_size"]
    legible = ", ".join(f"{k} {v:.1f} px" for k, v in heights.items())
    note = f"text in view: {legible}" if heights else None
    lines = ["## 4. Page retrieval from a page's own texts, through each head", "",
             "Query: all box-text descriptors of a page (geometric head) or k of its text spans (semantic "
             "head), from the text cache; candidates: every page image of the set at "
             f"{size} px; a page's score is the mean of its descriptors' cosines (a layout is the set of its "
             "boxes) or the log-sum-exp (T = 0.05) of its crops' cosines. Acc@1 in % with a 95% bootstrap "
             "interval over documents; chance = 1/pages.", "", legibility(heights, size), ""]
    crops = any(r["head"] == "sem_crops" for r in ret["rows"])
    if crops:
        lines += ["The span-crop gallery row: the same 5-text queries, but a page's candidates are its span-centred "
                  "crops (around each of its spans' centres, evenly spaced spans beyond the row's crop limit: a square of "
                  "the pretraining's local-view page pixels, at the local views' size); a query text scores a page by "
                  "its best crop, the page's score is the mean over the query's texts.", ""]
    if local and local[1]:
        lines += ["Pretraining's " + local[0] + (" (what the span-crop gallery row reads): " if crops else
                                                 " (not used by these queries): ") + ", ".join(
            f"{k} {v:.1f} px" for k, v in local[1].items()) + ".", ""]
    lines += ["### Held-out pages (documents never seen in pretraining)", "",
              retrieval_markdown(ret["rows"], "held-out", note), ""]
    docs = ret["doc_ids"]["held-out"]
    for other in ("random backbone, heads trained", "random (untrained)"):
        g = paired_gain(ret["rows"], other, "pretrained", "held-out", "geom", "all", doc_of=docs)
        if g is not None:
            lines.append("- geometric Acc@1, " + claim(other, "pretrained", 100 * g["diff"],
                                                       [100 * v for v in g["ci95"]], "points"))
    for r in ret["rows"]:
        if r["split"] == "held-out" and r["head"] in ("sem", "sem_crops") and r["k"] == 5:
            gallery = ", span-crop gallery" if r["head"] == "sem_crops" else ""
            lines.append(f"- semantic Acc@1 from 5 text crops{gallery}, " + chance_claim(
                r["model"], 100 * r["acc1"], [100 * v for v in r["ci95"]], 100 * r["chance"]))
    lines += ["", "### Training pages (what the objective fitted)", "", retrieval_markdown(ret["rows"], "training", note), ""]
    return lines


def _source(cfg) -> str:
    lab = cfg.labelled
    if lab.release:
        return f"the {lab.dataset} release in {lab.release} (its labelled pages)"
    if lab.coco:
        return f"labelled pages of {lab.coco}"
    return "PDFs in " + str(cfg.pdfs) if cfg.pdfs else "embedded synthetic pages"


def write_demo_report(cfg, out: Path, run_dir: Path, control_dir: Path | None, info: dict, times: dict) -> Path:
    from gsdistill.tuples.store.reader import read_pages
    table, change = loss_table(run_dir / "metrics.csv")
    pcfg = load_config("pretrain", run_dir / "config.yaml")
    plots = sorted((run_dir / "plots").glob("*.png")) if (run_dir / "plots").is_dir() else []
    held = list(read_pages(out / "data" / "eval", decode_images=False))
    heights = text_height_in_view(held, info["retrieval"]["image_size"])
    lines = ["# gsdistill demo report", "",
             f"Source: {_source(cfg)}; seed {cfg.seed}; "
             f"stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()) + ".", ""]
    lines += data_section(info["data"])
    lab = info["data"].get("labelled")
    imgsz = int(load_config("detect", "compare", [*cfg.detect]).imgsz)
    if lab:
        pages = [*read_pages(out / "data" / "train", decode_images=False), *held]
        lines += labelled_section(lab, imgsz, [float(f) for f in cfg.detect_label_fractions], pages)
    lines += ["## 2. GSDistill pretraining", "", f"Run: `{rel(run_dir, out)}` (resolved config in "
              f"`config.yaml`, metrics in `metrics.csv`, backbone export in `backbone/`)."
              + (f" Control (backbone frozen at random, heads trained the same way): `{rel(control_dir, out)}`."
                 if control_dir else ""), "", table, "", scale_against_detector(held, pcfg.views, imgsz), ""]
    lines += distill_verdict(change, int(pcfg.model.dino_out_dim), info["retrieval"].get("teacher_spread"))
    ramp = int(pcfg.objective.distill_warmup_steps)
    if ramp:
        lines += [f"The self-distillation weights λ3, λ4 ramp in from 0 over the first {ramp} steps "
                  "(`objective.distill_warmup_steps`), so `total` (weighted) is not comparable across the ramp; "
                  "the terms themselves are logged unweighted.", ""]
    lines += [f"![{p.stem}]({rel(p, out)})" for p in plots] + [""]
    lines += detect_section(info["detect"], out, float(cfg.report_min_reference_map50))
    lines += budgets_section(info.get("detect_budgets"))
    lines += human_labels_section(info.get("human_labels"))
    lines += retrieval_section(info["retrieval"], heights, local_view_heights(held, pcfg.views))
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
