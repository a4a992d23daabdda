"""The detection sections of the demo report: head-only on the pretrained vs the random backbone, the stock
reference and its learning curve, and the same detectors on human-labelled pages."""
from __future__ import annotations

import math
from pathlib import Path

from gsdistill.pipelines.report_text import claim, rel


def resampled(b: dict) -> str:
    """What a :func:`gsdistill.detect.map_bootstrap.paired_map_bootstrap` result resampled, in words."""
    unit = b.get("unit", "documents")
    if b.get("n_strata", 1) > 1:
        return f"their {b['n_docs']} {unit}, drawn within each of their {b['n_strata']} documents (stratified)"
    return f"their {b['n_docs']} {unit}"


def _map_claims(paired: dict) -> list[str]:
    """One claim per metric from a :func:`gsdistill.detect.map_bootstrap.rows_bootstrap` result, in mAP points."""
    return [f"- {name}, " + claim(paired["a"], paired["b"], 100 * paired[key]["diff"],
                                   [100 * v for v in paired[key]["ci95"]], "points", digits=2)
            for key, name in (("map50", "mAP@50"), ("map50_95", "mAP@[50:95]"))]


def _class_claims(paired: dict) -> list[str]:
    """Each class's AP@50, B − A, when the bootstrap kept them: mAP weighs a rare class as much as a common one."""
    per_class = paired.get("per_class")
    if not per_class:
        return []
    lines = [f"- {name}: no held-out boxes of this class" if math.isnan(d["diff"]) else
             f"- {name}: " + claim(paired["a"], paired["b"], 100 * d["diff"], [100 * v for v in d["ci95"]], "points", digits=2)
             for name, d in per_class.items()]
    return ["AP@50 of each class, the same pages and resamples (a class with few boxes can move the mAP alone):", ""] + \
        lines + [""]


def reference_verdict(name: str | None, map50: float | None, threshold: float) -> str:
    """Whether the stock reference learned enough (mAP@50 >= ``threshold``) for the section's comparisons to mean anything."""
    if name is None:
        return ("No stock reference was trained (`detect_reference: null`): nothing here shows whether this "
                "detection set-up can learn at this budget.")
    own = f"The stock reference, {name}, reached {100 * map50:.2f} % mAP@50 on the held-out pages"
    if map50 < threshold:
        return (f"{own}, below the {100 * threshold:.0f} % this report requires (`report_min_reference_map50`): the "
                "detection set-up learned too little at this budget for the comparisons in this section to mean anything.")
    return f"{own}, at least the {100 * threshold:.0f} % this report requires (`report_min_reference_map50`)."


def _train_pages(det: dict) -> str:
    n = det.get("train_pages") or {}
    if not n.get("extra"):
        return "pretraining pages"
    return (f"{n['pretraining']} pretraining pages and {n['extra']} pages of other documents (`detect_extra_pdfs`; "
            f"never pretrained on, never held out) at the pretraining pages' optimizer steps ({' '.join(det['overrides'][-2:])})")


def detect_section(det: dict, out: Path, min_reference_map50: float) -> list[str]:
    from gsdistill.detect.compare import markdown_table
    summary = {s["backbone"]: s for s in det["summary"]}
    paired = det["paired"]
    ref = paired.get("reference", {}).get("a")
    head = f" (trained: {det['head']})" if det.get("head") else ""
    lines = ["## 3. Layout detection on held-out pages (same head, same budget)", "",
             "Head-only YOLOv10 on the frozen pretrained backbone vs on a random backbone of the same "
             f"architecture{head}, and a stock YOLOv10n with every layer trained, as a reference; trained on "
             f"{_train_pages(det)}, scored by pycocotools on held-out documents; mean ± sample std over seeds.", "",
             markdown_table(det["summary"]), "", reference_verdict(ref, summary[ref]["map50_mean"] if ref else None,
                                                                   min_reference_map50), ""]
    b = paired["backbone"]
    lines += [f"Differences of the seed-mean mAP on the same {b['n_images']} held-out pages, with a 95 % percentile "
              f"bootstrap interval over {resampled(b)} ({b['n_boot']} resamples; COCO's mAP recomputed on each):", ""]
    lines += _map_claims(b) + [""] + _class_claims(b)
    if ref:
        own = det.get("reference_overrides") or []
        setting = (f"same optimizer steps, the reference with its own {', '.join(f'`{o}`' for o in own)} "
                   "(`detect_reference_overrides`: the setting measured better for it)" if own else "same budget")
        lines += [f"The paper's headline, in the small: head-only on the pretrained backbone vs {ref}, {setting}:", ""]
        lines += _map_claims(paired["reference"]) + [""]
    lines += reference_curve(det.get("rows", []), out)
    lines += [f"Held-out pages with the pretrained detector's boxes (confidence ≥ {det['predict_conf']}):", ""]
    lines += [f"![prediction]({rel(p, out)})" for p in det.get("predictions", [])]
    return lines + [""]


def reference_curve(rows: list[dict], out: Path) -> list[str]:
    """The stock reference's held-out mAP@50 after each epoch against wall minutes (when it was validated
    every epoch, ``detect_reference_curve``): a sentence and ``detect/reference_curve_s<seed>.png``."""
    from gsdistill.run_log import Line, Panel, line_plot, read_rows
    lines = []
    for r in rows:
        csv = Path(r["run_dir"]) / "results.csv"
        if not r.get("curve") or not csv.is_file():  # without per-epoch validation the csv's mAP columns are zeros
            continue
        pts = [(float(e["time"]) / 60, float(e["metrics/mAP50(B)"])) for e in read_rows(csv)
               if e.get("metrics/mAP50(B)") not in (None, "")]
        if len(pts) < 2:
            continue
        png = line_plot(out / "detect" / f"reference_curve_s{r['seed']}.png", [Panel(
            f"{r['backbone']}, seed {r['seed']}", [Line("held-out mAP@50", [m for m, _ in pts], [100 * v for _, v in pts],
                                                       marker="o")],
            xlabel="training wall minutes", ylabel="mAP@50 (%, Ultralytics)")])
        lines += [f"Learning curve of {r['backbone']} (seed {r['seed']}; Ultralytics' mAP@50 on the held-out pages "
                  "after each epoch): " + ", ".join(f"{m:.0f} min {100 * v:.1f} %" for m, v in pts) + ".", "",
                  f"![reference curve]({rel(png, out)})", ""]
    return lines


def human_labels_section(hl: dict | None) -> list[str]:
    """The same detectors on human-labelled pages, pretrained vs random backbone paired over documents."""
    if not hl:
        return []
    lines = ["## 3b. The same detectors on pages with human layout labels", "",
             "No further training: the heads trained on the PDF builder's labels above, scored by pycocotools on "
             "pages people labelled (DocBank's classes mapped as the DocBank builder does; PubLayNet's own).", ""]
    for name, res in hl.items():
        by = {}
        for r in res["rows"]:
            by.setdefault(r["backbone"], []).append(r)
        lines += [f"**{name}** ({res['images']} pages): " + "; ".join(
            f"{b} mAP@50 " + ", ".join(f"{100 * r['map50']:.2f}" for r in rs) + " % (seeds " +
            ", ".join(str(r["seed"]) for r in rs) + ")" for b, rs in by.items()), ""]
        if res.get("bootstrap"):
            boot = res["bootstrap"]
            lines += [f"Paired over its {boot['n_docs']} documents ({boot['n_boot']} resamples):", ""]
            lines += _map_claims(boot) + [""]
    return lines
