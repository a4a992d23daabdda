"""The demo's low-label and short-budget view of paper 003's claim (issue 34 item 3).

A frozen pretrained backbone should matter most where the head has little to learn from: few
labelled pages, or few epochs. ``detect_label_fractions`` trains the same three detectors as the
detect stage (head-only on the pretrained backbone, head-only on its random twin, the stock
reference with every layer trained) on a seeded share of the training pages, at the optimizer steps
of the full set (the labels change, not the budget); ``detect_head_epochs`` trains them on all the
pages for other numbers of epochs. Every setting is scored on the same held-out pages, with
pretrained − random and pretrained − reference paired over the held-out documents.
"""
from __future__ import annotations

from pathlib import Path

from gsdistill.config import load_config

PRETRAINED, RANDOM = "pretrained", "random backbone"


def settings(cfg) -> list[tuple[str, float, int | None]]:
    """``(label, fraction of the training pages, epochs or None = the detect stage's)`` per setting."""
    out = [(f"{100 * float(f):g} % of the training pages", float(f), None) for f in cfg.detect_label_fractions]
    out += [(f"{int(e)} head epochs", 1.0, int(e)) for e in cfg.detect_head_epochs]
    return out


def detect_budgets(cfg, data_yaml: str | Path, backbone: Path, out: Path, overrides: list[str] | None = None) -> list[dict] | None:
    """Train and score the detectors of every setting; None when the demo asks for none. ``overrides``: the
    detect stage's own (``cfg.detect`` by default; with extra detection pages, its scaled epochs too)."""
    from gsdistill.detect.compare import compare_backbones
    from gsdistill.detect.map_bootstrap import rows_bootstrap
    from gsdistill.detect.subset import epochs_for_steps, subset_data, train_images

    todo = settings(cfg)
    if not todo:
        return None
    overrides = [*cfg.detect] if overrides is None else list(overrides)
    base = load_config("detect", "compare", overrides)
    base_ref = load_config("detect", "compare", [*overrides, *cfg.detect_reference_overrides])
    full, seed = train_images(data_yaml), int(cfg.detect_seeds[0])
    reference = f"{cfg.detect_reference} (stock, all layers trained)" if cfg.detect_reference else None
    results = []
    for i, (label, fraction, epochs) in enumerate(todo):
        folder = out / "detect_budgets" / f"setting{i}"
        dcfg, rcfg = base.copy(), base_ref.copy()
        data = data_yaml
        if fraction < 1.0:
            data = subset_data(data_yaml, fraction, seed, folder / "data")
            dcfg.epochs = epochs_for_steps(int(base.epochs), full, train_images(data), int(base.batch))
        else:
            dcfg.epochs = int(epochs)
        rcfg.epochs = dcfg.epochs  # the reference's own overrides (detect_reference_overrides), at the same steps
        rows = compare_backbones(data, {PRETRAINED: str(backbone), RANDOM: None}, seeds=[seed], cfg=dcfg, out_dir=folder)
        if reference:
            rows += compare_backbones(data, {reference: str(cfg.detect_reference)}, seeds=[seed], cfg=rcfg,
                                      out_dir=folder / "reference")
        paired = {"backbone": rows_bootstrap(rows, data, RANDOM, PRETRAINED, seed=int(cfg.seed))}
        if reference:
            paired["reference"] = rows_bootstrap(rows, data, reference, PRETRAINED, seed=int(cfg.seed))
        results.append({"setting": label, "fraction": fraction, "train_images": train_images(data),
                        "epochs": int(dcfg.epochs), "optimizer_steps": rows[0]["optimizer_steps"],
                        "map50": {r["backbone"]: r["map50"] for r in rows}, "paired": paired})
    return results


def _diff(p: dict | None) -> str:
    if p is None:
        return "–"
    d, (lo, hi) = 100 * p["map50"]["diff"], (100 * v for v in p["map50"]["ci95"])
    return f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def budgets_section(results: list[dict] | None) -> list[str]:
    """The report's table of the settings (empty when none ran)."""
    if not results:
        return []
    from gsdistill.pipelines.demo_report_detect import resampled

    ref = next((k for k in results[0]["map50"] if k not in (PRETRAINED, RANDOM)), None)
    lines = ["### Few labels, few epochs (paper 003's claim where the head has little to learn from)", "",
             "The same detectors trained on a share of the training pages (at the optimizer steps of all of "
             "them: the labels change, not the budget) or for fewer or more epochs, scored on the same "
             f"held-out pages; mAP@50 in %, differences with a 95 % bootstrap over {resampled(results[0]['paired']['backbone'])}.", "",
             f"| setting | training pages | epochs | optimizer steps | pretrained | random backbone | {ref or 'reference'} "
             "| pretrained − random | pretrained − reference |", "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in results:
        m = r["map50"]
        lines.append(f"| {r['setting']} | {r['train_images']} | {r['epochs']} | {r['optimizer_steps']} "
                     f"| {100 * m[PRETRAINED]:.2f} | {100 * m[RANDOM]:.2f} | "
                     f"{f'{100 * m[ref]:.2f}' if ref else '–'} | {_diff(r['paired']['backbone'])} "
                     f"| {_diff(r['paired'].get('reference'))} |")
    return lines + [""]
