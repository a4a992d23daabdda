"""Tables (markdown, CSV) and the accuracy-vs-k plot of page-retrieval results.

``results`` maps a model label (e.g. "SP", "MPCL") to the dict returned by
``gsdistill.eval.page_retrieval.evaluate_page_retrieval``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gsdistill.eval.page_retrieval import MEASURES
from gsdistill.run_log import Line, Panel, line_plot, write_rows

SCORING_NAMES = {"multi_positive": "per crop (multi-positive)",
                 "single_positive": "concatenated (single-positive)"}


def summary_rows(results: dict[str, dict]) -> list[dict]:
    """One row per (model, scoring, k): every measure's mean and std over the crop seeds."""
    rows = []
    for label, res in results.items():
        for scoring, per_k in res["summary"].items():
            for k, per_m in per_k.items():
                row = {"model": label, "scoring": scoring, "k": int(k),
                       "crops_mean": res["crops_per_query"][k], "n_gallery": res["n_gallery"],
                       "seeds": len(res["per_seed"][scoring][k])}
                for m in MEASURES:
                    row[f"{m}_mean"], row[f"{m}_std"] = per_m[m]["mean"], per_m[m]["std"]
                rows.append(row)
    return rows


def _pct(mean: float, std: float) -> str:
    return f"{100 * mean:.1f} ± {100 * std:.1f}"


def markdown_table(results: dict[str, dict]) -> str:
    """Table 2 layout (Acc@1 % per k, mean ± std over seeds) followed by every measure per k."""
    rows = summary_rows(results)
    ks = sorted({r["k"] for r in rows})
    pairs = list(dict.fromkeys((r["model"], r["scoring"]) for r in rows))
    cell = {(r["model"], r["scoring"], r["k"]): r for r in rows}
    out = ["| model | scoring | " + " | ".join(f"{k} crop{'s' if k > 1 else ''}" for k in ks) + " |",
           "|---|---|" + "---:|" * len(ks)]
    for model, scoring in pairs:
        vals = [_pct(cell[model, scoring, k]["Acc@1_mean"], cell[model, scoring, k]["Acc@1_std"])
                if (model, scoring, k) in cell else "" for k in ks]
        out.append(f"| {model} | {SCORING_NAMES.get(scoring, scoring)} | " + " | ".join(vals) + " |")
    first = next(iter(results.values()))
    out += ["", f"Accuracy@1 in %, mean ± std over {len(first['per_seed'][rows[0]['scoring']][ks[0]])} "
            f"crop-sampling seeds; gallery {first['n_gallery']} pages from {first['n_docs']} documents "
            f"(chance {100 * first['chance_acc1']:.2f}%), {first['search']} search, "
            f"aggregation {first['aggregation']} (T={first['temperature']}).", "",
            "| model | scoring | k | " + " | ".join(MEASURES) + " |", "|---|---|---:|" + "---:|" * len(MEASURES)]
    for r in rows:
        out.append(f"| {r['model']} | {r['scoring']} | {r['k']} | "
                   + " | ".join(_pct(r[f'{m}_mean'], r[f'{m}_std']) for m in MEASURES) + " |")
    return "\n".join(out) + "\n"


def paired_difference(results: dict[str, dict], a: tuple[str, str], b: tuple[str, str], k: int,
                      n_boot: int = 2000, seed: int = 0) -> dict:
    """Acc@1 of ``b`` minus ``a`` (each a (model, scoring)) on the same queries, with a 95% CI.

    Per query the top-1 hits are averaged over the crop seeds; the CI is a percentile bootstrap
    that resamples **documents** (pages of one document are correlated, so they are drawn together;
    results without ``doc_ids`` fall back to one document per page).
    """
    from gsdistill.eval.head_retrieval import bootstrap_by_document
    ra, rb = results[a[0]], results[b[0]]
    if ra["page_ids"] != rb["page_ids"]:
        raise ValueError(f"paired comparison needs the same gallery: {a[0]} and {b[0]} differ")
    ha = np.mean([ra["hits_at_1"][a[1]][k][s] for s in sorted(ra["hits_at_1"][a[1]][k])], axis=0)
    hb = np.mean([rb["hits_at_1"][b[1]][k][s] for s in sorted(rb["hits_at_1"][b[1]][k])], axis=0)
    diff = hb - ha
    docs = ra.get("doc_ids") or list(ra["page_ids"])
    lo, hi = bootstrap_by_document(diff, docs, n_boot, seed)
    return {"a": list(a), "b": list(b), "k": int(k), "diff": float(diff.mean()), "ci95": [lo, hi],
            "n_queries": int(len(diff)), "n_docs": len(set(docs))}


def default_pairs(results: dict[str, dict]) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """With two or more models A, B (first two labels): Table 2's pairing (A concatenated vs B per
    crop) and each scoring across the two models."""
    labels = list(results)
    if len(labels) < 2:
        return []
    a, b = labels[:2]
    scorings = set(results[a]["summary"]) & set(results[b]["summary"])
    pairs = [((a, "single_positive"), (b, "multi_positive"))] if scorings == set(SCORING_NAMES) else []
    return pairs + [((a, s), (b, s)) for s in SCORING_NAMES if s in scorings]


def paired_table(results: dict[str, dict], pairs=None) -> str:
    rows = ["| B − A | " + " | ".join(f"k={k}" for k in _ks(results)) + " |",
            "|---|" + "---:|" * len(_ks(results))]
    for a, b in (default_pairs(results) if pairs is None else pairs):
        cells = []
        for k in _ks(results):
            d = paired_difference(results, a, b, k)
            cells.append(f"{100 * d['diff']:+.1f} [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}]")
        rows.append(f"| {b[0]} {b[1]} − {a[0]} {a[1]} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n" if len(rows) > 2 else ""


def _ks(results: dict[str, dict]) -> list[int]:
    return sorted({int(k) for r in results.values() for per_k in r["summary"].values() for k in per_k})


def plot_acc_vs_k(results: dict[str, dict], path: str | Path, measure: str = "Acc@1") -> Path:
    """Accuracy vs crops per query, one line per (model, scoring), error bars = std over seeds."""
    rows = summary_rows(results)
    colors = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(r["model"] for r in rows))}
    lines = []
    for model, scoring in dict.fromkeys((r["model"], r["scoring"]) for r in rows):
        sel = sorted((r for r in rows if r["model"] == model and r["scoring"] == scoring), key=lambda r: r["k"])
        lines.append(Line(f"{model}, {SCORING_NAMES.get(scoring, scoring)}", [r["k"] for r in sel],
                          [100 * r[f"{measure}_mean"] for r in sel], err=[100 * r[f"{measure}_std"] for r in sel],
                          color=colors[model], style="-" if scoring == "multi_positive" else "--"))
    first = next(iter(results.values()))
    panel = Panel(f"Crop-subsampled page retrieval, {first['n_gallery']} pages", lines,
                  xlabel="text crops per query (k)", ylabel=f"{measure} (%)",
                  hlines={"chance": 100 * first["chance_acc1"]})
    return line_plot(path, [panel], panel_size=(6.0, 4.0), dpi=120, grid=True)


def write_report(results: dict[str, dict], out_dir: str | Path) -> dict[str, Path]:
    """``results.json``, ``metrics.csv``, ``table.md`` and ``acc_vs_k.png`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "csv": out / "metrics.csv", "table": out / "table.md",
             "plot": out / "acc_vs_k.png"}
    paths["json"].write_text(json.dumps(results, indent=2, default=str))
    write_rows(paths["csv"], summary_rows(results))
    paired = paired_table(results)
    if paired:
        paired = ("\nPaired Acc@1 differences in points, B − A on the same queries (hits averaged over "
                  "crop seeds), [95% bootstrap CI over queries]:\n\n" + paired)
    paths["table"].write_text(markdown_table(results) + paired)
    plot_acc_vs_k(results, paths["plot"])
    return paths
