"""Head-only detection variants, each on the pretrained backbone AND its random twin, on the same pages.

Issue 34 asks which detector set-up lets the head use what the backbone knows (the adapter's
features, resolution, budget, labels), always beside the random twin of the same architecture so
the comparison stays fair. One variant = a name and ``key=value`` detect overrides on top of the
base overrides; each trains ``pretrained[<name>]`` and ``random[<name>]`` (and with ``--stock`` a
fully trained ``yolov10n[<name>]``) through :func:`gsdistill.detect.compare.compare_backbones`,
scored with pycocotools on the data's held-out ``val`` split (``last.pt``; no checkpoint picked on
held-out pages). ``--train-fraction`` trains on a seeded share of the training pages (the
low-label setting; the held-out pages stay all).

    python tools/experiments/detect_sweep.py run --data DATA_YAML --backbone RUN/backbone --out OUT \\
        --variant last:adapter_features=last --variant mix:adapter_features=mix [--stock] [--seeds 0] \\
        [--train-fraction 0.1] [imgsz=320 epochs=12 ...]
    python tools/experiments/detect_sweep.py report OUT [OUT2 ...] [--markdown table.md] [--per-class]

``report`` merges the ``rows.json`` of several ``run`` folders (two runs can share the 2 cores) and
prints per variant the mAP of each backbone and, with a 95 % bootstrap over the held-out documents,
pretrained - random, pretrained - stock, and each variant's pretrained and random rows minus the
first variant's; ``--per-class`` adds each class's AP@50, pretrained - random (mAP weighs a class
with 70 training boxes as much as one with 20,000).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gsdistill.config import load_config  # noqa: E402
from gsdistill.detect.compare import compare_backbones  # noqa: E402
from gsdistill.detect.map_bootstrap import rows_bootstrap  # noqa: E402
from gsdistill.detect.subset import subset_data  # noqa: E402


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition(":")
    return name, [o for o in overrides.split(",") if o]


def run(args) -> None:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = args.data.resolve()
    if args.train_fraction < 1.0:
        data = subset_data(data, args.train_fraction, args.subset_seed, out / "data")
    variants = [parse_variant(v) for v in args.variant] or [("base", [])]
    rows = []
    for name, overrides in variants:
        cfg = load_config("detect", "compare", list(args.overrides) + overrides)
        backbones = {} if args.no_pretrained else {f"pretrained[{name}]": str(args.backbone)}
        if not args.no_random:
            backbones[f"random[{name}]"] = None
        if args.stock:
            backbones[f"yolov10n[{name}]"] = "yolov10n.yaml"
        rows += compare_backbones(data, backbones, seeds=args.seeds, cfg=cfg, out_dir=out / name,
                                   reference=args.backbone)
        for r in rows:
            r["variant"], r["data_yaml"] = r["backbone"].split("[")[1].rstrip("]"), str(data)
        (out / "rows.json").write_text(json.dumps(rows, indent=1))


def _pm(d: dict) -> str:
    return f"{100 * d['diff']:+.2f} [{100 * d['ci95'][0]:+.2f}, {100 * d['ci95'][1]:+.2f}]"


def per_class_table(rows: list[dict], variants: list[str], n_boot: int) -> str:
    """AP@50 of each class, pretrained − random per variant: which classes carry (or hide) a backbone's lead."""
    lines = ["| variant | class | pretrained AP@50 | random | pretrained − random |", "|---|---|---:|---:|---|"]
    for v in variants:
        p, r = f"pretrained[{v}]", f"random[{v}]"
        same = [x for x in rows if x["backbone"] in (p, r)]
        if {x["backbone"] for x in same} != {p, r}:
            continue
        res = rows_bootstrap(same, same[0]["data_yaml"], r, p, n_boot=n_boot, per_class=True)
        for name, d in res["per_class"].items():
            lines.append(f"| {v} | {name} | {100 * sum(d['b']) / len(d['b']):.2f} | {100 * sum(d['a']) / len(d['a']):.2f} "
                         f"| {_pm(d)} |")
    return "AP@50 per class (%), paired 95 % bootstrap over documents:\n\n" + "\n".join(lines)


def report(args) -> None:
    rows = [r for folder in args.folders for r in json.loads((folder / "rows.json").read_text())]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    data_yaml = rows[0]["data_yaml"]
    lines = ["| variant | pretrained mAP@50 / @[50:95] | random | yolov10n | pretrained − random, mAP@50 "
             f"| pretrained − yolov10n | pretrained − pretrained[{variants[0]}] | random − random[{variants[0]}] |",
             "|---|---:|---:|---:|---|---|---|---|"]

    def mean(name: str, key: str) -> str:
        vals = [r[key] for r in rows if r["backbone"] == name]
        return f"{100 * sum(vals) / len(vals):.2f}" if vals else "–"

    def boot(a: str, b: str) -> str:
        have = {r["backbone"] for r in rows}
        if a not in have or b not in have or a == b:
            return "–"
        same = [r for r in rows if r["backbone"] in (a, b)]
        return _pm(rows_bootstrap(same, same[0]["data_yaml"], a, b, n_boot=args.n_boot)["map50"])

    for v in variants:
        p, r, s = f"pretrained[{v}]", f"random[{v}]", f"yolov10n[{v}]"
        lines.append(f"| {v} | {mean(p, 'map50')} / {mean(p, 'map50_95')} | {mean(r, 'map50')} / {mean(r, 'map50_95')} "
                     f"| {mean(s, 'map50')} / {mean(s, 'map50_95')} | {boot(r, p)} | {boot(s, p)} "
                     f"| {boot(f'pretrained[{variants[0]}]', p)} | {boot(f'random[{variants[0]}]', r)} |")
    text = (f"Held-out pages of {data_yaml}; mAP in %, differences with a 95 % bootstrap over documents "
            f"({args.n_boot} resamples), seed-mean over {sorted({r['seed'] for r in rows})}.\n\n" + "\n".join(lines))
    if args.per_class:
        text += "\n\n" + per_class_table(rows, variants, args.n_boot)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--data", type=Path, required=True)
    r.add_argument("--backbone", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--variant", action="append", default=[], help="name:key=value,key=value (repeatable)")
    r.add_argument("--no-pretrained", action="store_true",
                   help="skip the pretrained backbone (its rows come from another run folder, merged by report)")
    r.add_argument("--stock", action="store_true", help="also train the stock yolov10n fully, per variant")
    r.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0])
    r.add_argument("--no-random", action="store_true",
                   help="skip the random twin (e.g. several checkpoints of one run, whose twin is measured once)")
    r.add_argument("--train-fraction", type=float, default=1.0)
    r.add_argument("--subset-seed", type=int, default=0)
    r.add_argument("overrides", nargs="*", help="detect key=value overrides for every variant")
    p = sub.add_parser("report")
    p.add_argument("folders", type=Path, nargs="+")
    p.add_argument("--markdown", type=Path)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--per-class", action="store_true", help="also each class's AP@50, pretrained − random")
    args = parser.parse_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
