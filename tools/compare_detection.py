"""Same-budget comparison of layout detectors (paper 003 §6.1 setting, at a small budget).

Models, each trained with Ultralytics' trainer for the same epochs / image size / batch / data:
  pretrained  head-only on the exported (pretrained) backbone, ViT frozen
  random      head-only on a randomly initialised backbone of the same architecture, ViT frozen
  yolov10n    YOLOv10n (ultralytics yolov10n.yaml) trained fully from scratch, no weights
Data sets: synthetic pages, the 20 real PubLayNet example pages, the 100 real DocBank sample pages
(token labels grouped into region boxes by gsdistill.data).

    python tools/compare_detection.py --backbone RUN_DIR/backbone --out runs/compare \
        --epochs 10 --imgsz 256 [--datasets synthetic,publaynet,docbank] [--markdown docs/detection_table.md]

Writes OUT/results.csv, OUT/results.json and prints a markdown table (also to --markdown); rows of an
earlier call with the same OUT are kept unless this call re-runs the same (data set, model).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")

import timm  # noqa: E402
from ultralytics import YOLO  # noqa: E402

from gsdistill.config import load_config  # noqa: E402
from gsdistill.detect.checks import check_yolo_dataset  # noqa: E402
from gsdistill.detect.convert import coco_to_yolo, pages_to_yolo  # noqa: E402
from gsdistill.detect.pipeline import train_args, train_head, validate  # noqa: E402
from gsdistill.detect.run_logging import add_run_callbacks  # noqa: E402
from gsdistill.models.backbone import read_backbone_meta, save_backbone  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
MODELS = ("pretrained", "random", "yolov10n")


def build_dataset(name: str, out: Path, args) -> Path:
    """Data YAML of one comparison data set (converted once into ``out``)."""
    if (out / "data.yaml").is_file():
        return out / "data.yaml"
    if name == "synthetic":
        from gsdistill.data.synthetic import generate_pages
        pages = generate_pages(args.synthetic_pages, seed=args.seed, width=306, height=396)
        return pages_to_yolo(pages, out, val_fraction=0.25, seed=args.seed)
    if name == "publaynet":
        from gsdistill.data.labels import PUBLAYNET_CLASSES
        root = args.shared / "publaynet_examples"
        return coco_to_yolo(root / "samples.json", root / "images", out, PUBLAYNET_CLASSES,
                            val_fraction=0.25, seed=args.seed)
    if name == "docbank":
        from gsdistill.data.docbank import docbank_pages
        return pages_to_yolo(docbank_pages(args.shared / "docbank_samples"), out, val_fraction=0.25, seed=args.seed)
    raise ValueError(f"unknown data set '{name}'")


def random_twin(backbone_dir: Path, out: Path, seed: int) -> Path:
    """A randomly initialised backbone with exactly the pretrained one's architecture."""
    import torch
    meta = read_backbone_meta(backbone_dir)
    torch.manual_seed(seed)
    model = timm.create_model(meta["model_name"], pretrained=False, **meta["kwargs"])
    spec = {"name": meta["model_name"], **{k: v for k, v in meta["kwargs"].items()
                                           if k not in ("dynamic_img_size",)}}
    return save_backbone(model, spec, out, extra={"source": "random init (seed %d)" % seed})


def run_one(model: str, data: Path, backbone: Path, cfg_over: list[str], out: Path, name: str):
    cfg = load_config("detect", None, cfg_over + [f"data={data}", f"project={out}", f"name={name}"])
    t0 = time.time()
    if model == "yolov10n":
        run_dir = out / name
        yolo = YOLO("yolov10n.yaml", task="detect")  # architecture only, random init, nothing downloaded
        add_run_callbacks(yolo, run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        args = train_args(cfg, str(data), run_dir)
        args.update(freeze=None, pretrained=False)
        yolo.train(**args)
    else:
        cfg.backbone = str(backbone)
        run_dir = train_head(cfg)
    seconds = time.time() - t0
    cfg.project = str(out / f"{name}_val")
    report = validate(run_dir / "weights" / "best.pt", data, cfg=cfg)
    if model == "yolov10n":  # trained fully: every parameter except the fixed DFL conv
        report["params_trainable"] = json.loads((run_dir / "params.json").read_text())["params_trainable"]
    return report, seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbone", required=True, type=Path, help="exported (pretrained) backbone folder")
    p.add_argument("--out", type=Path, default=Path("runs/compare_detection"))
    p.add_argument("--datasets", default="synthetic,publaynet,docbank")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr0", type=float, default=0.01, help="AdamW learning rate, the same for every model")
    p.add_argument("--synthetic-pages", type=int, default=64)
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shared", type=Path, default=SHARED, help="folder of the real data sets")
    p.add_argument("--markdown", type=Path, help="also write the markdown table here")
    args = p.parse_args(argv)
    out = args.out.resolve()
    twin = random_twin(args.backbone, out / "random_backbone", args.seed)
    over = [f"epochs={args.epochs}", f"imgsz={args.imgsz}", f"batch={args.batch}", "workers=0", f"lr0={args.lr0}", "cache=ram",
            f"seed={args.seed}", "augment.mosaic=0.0", "augment.close_mosaic=0"]
    if args.device:
        over.append(f"device={args.device}")
    previous = out / "results.json"  # rows of earlier invocations (other models / data sets) are kept
    rows = json.loads(previous.read_text())["rows"] if previous.is_file() else []
    for ds in args.datasets.split(","):
        data = build_dataset(ds, out / "data" / ds, args)
        sizes = check_yolo_dataset(data)
        for model in args.models.split(","):
            backbone = {"pretrained": args.backbone.resolve(), "random": twin}.get(model)
            rep, secs = run_one(model, data, backbone, over, out / "runs" / ds, model)
            rows = [r for r in rows if (r["dataset"], r["model"]) != (ds, model)]
            rows.append({"dataset": ds, "model": model, "train_images": sizes["train"]["images"],
                         "val_images": sizes["val"]["images"], "params_total": rep["params_total"],
                         "params_trainable": rep["params_trainable"], "mAP50": rep["mAP50"],
                         "mAP50-95": rep["mAP50-95"], "coco_mAP50": rep["coco_mAP50"],
                         "coco_mAP50-95": rep["coco_mAP50-95"], "train_seconds": round(secs, 1)})
            print(json.dumps(rows[-1]), flush=True)
    order = {m: i for i, m in enumerate(MODELS)}
    rows.sort(key=lambda r: (r["dataset"], order.get(r["model"], 99)))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                  "rows": rows}, indent=1))
    table = markdown_table(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    return 0


def markdown_table(rows: list[dict]) -> str:
    def pct(v):  # two decimals: at small budgets the differences sit below 1 point
        return "-" if v is None else f"{100 * v:.2f}"
    lines = ["| data (train/val pages) | model | trainable / total params (M) | mAP50 | mAP50-95 | "
             "COCO mAP50 | COCO mAP50-95 | train s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} ({r['train_images']}/{r['val_images']}) | {r['model']} | "
                     f"{r['params_trainable'] / 1e6:.2f} / {r['params_total'] / 1e6:.2f} | {pct(r['mAP50'])} | "
                     f"{pct(r['mAP50-95'])} | {pct(r['coco_mAP50'])} | {pct(r['coco_mAP50-95'])} | "
                     f"{r['train_seconds']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
