"""Same-budget comparison of layout detectors (paper 003 §6.1 setting, at a small budget).

Models, each trained with Ultralytics' trainer at the same config (configs/detect/compare.yaml plus
key=value overrides) on the same data, scored on the same held-out pages by pycocotools:
  pretrained  head-only on the exported (pretrained) backbone, ViT frozen
  random      head-only on a random backbone of the same architecture (init seeded per seed), ViT frozen
  yolov10n    YOLOv10n (ultralytics yolov10n.yaml) trained fully from scratch, no weights
Data sets: synthetic pages (the demo's 512x640 pages, split by document), the 20 real PubLayNet
example pages, the 100 real DocBank sample pages (token labels grouped into region boxes).

    python tools/experiments/compare_detection.py --backbone RUN_DIR/backbone --out runs/compare --seeds 0,1 \
        [--datasets synthetic,publaynet,docbank] [--markdown table.md] [epochs=15 lr0=0.002 ...]

Writes OUT/<data set>/rows.json (one row per model and seed) and OUT/summary.json, and prints a
markdown table of mean ± sample std (ddof=1) over the seeds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")

from gsdistill.config import load_config  # noqa: E402
from gsdistill.detect.compare import compare_backbones, markdown_table, summarize  # noqa: E402

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def build_dataset(name: str, out: Path, args):
    """Data YAML (or page tuples) of one comparison data set."""
    from gsdistill.detect.convert import coco_to_yolo, pages_to_yolo
    if (out / "data.yaml").is_file():
        return out / "data.yaml"
    if name == "synthetic":
        from gsdistill.tuples.sources.synthetic import generate_pages
        pages = generate_pages(args.synthetic_pages, seed=0, width=512, height=640)
        return pages_to_yolo(pages, out, val_fraction=0.25, seed=0)
    if name == "publaynet":
        from gsdistill.tuples.labels import PUBLAYNET_CLASSES
        root = args.shared / "publaynet_examples"
        return coco_to_yolo(root / "samples.json", root / "images", out, PUBLAYNET_CLASSES, val_fraction=0.25, seed=0)
    if name == "docbank":
        from gsdistill.tuples.sources.docbank import docbank_pages
        return pages_to_yolo(docbank_pages(args.shared / "docbank_samples"), out, val_fraction=0.25, seed=0)
    raise ValueError(f"unknown data set '{name}' (synthetic, publaynet, docbank)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone", required=True, type=Path, help="exported (pretrained) backbone folder")
    p.add_argument("--out", type=Path, default=Path("runs/compare_detection"))
    p.add_argument("--datasets", default="synthetic")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds (>= 2 for a spread)")
    p.add_argument("--no-yolov10n", action="store_true", help="leave out the stock YOLOv10n reference column")
    p.add_argument("--synthetic-pages", type=int, default=128)
    p.add_argument("--config", default="compare", help="detect experiment file (configs/detect/)")
    p.add_argument("--shared", type=Path, default=SHARED, help="folder of the real data sets")
    p.add_argument("--markdown", type=Path, help="also write the markdown table here")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the detect config (all models)")
    args = p.parse_args(argv)

    cfg = load_config("detect", args.config, args.overrides)
    backbones = {"pretrained": str(args.backbone.resolve()), "random": None}
    if not args.no_yolov10n:
        backbones["yolov10n"] = "yolov10n.yaml"
    seeds = [int(s) for s in args.seeds.split(",")]
    out = args.out.resolve()
    tables, summary = [], {}
    for ds in args.datasets.split(","):
        data = build_dataset(ds, out / ds / "data", args)
        rows = compare_backbones(data, backbones, seeds, cfg, out / ds)
        summary[ds] = summarize(rows)
        tables.append(f"**{ds}**\n\n" + markdown_table(summary[ds]))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    text = "\n\n".join(tables)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
