"""``gsdistill detect {convert,export,train,val,predict}``: layout detection on the frozen backbone.

Config keys (``configs/detect/default.yaml``) come as trailing ``key=value`` arguments, after an
optional ``--config`` experiment file, as in every gsdistill stage.

A ``.pt`` file is a pickle, i.e. a program: one from an untrusted source can run code when loaded.
``val``, ``predict``, ``train model=`` and ``train resume=`` load with Ultralytics' weights_only path
(``safe_load=true``, the default) and refuse a file that names anything but torch / Ultralytics / timm /
gsdistill layer classes. ``safe_load=false`` (or Ultralytics' own ``ULTRALYTICS_SAFE_LOAD``, which
switches every load of a process to that path) is for files you made yourself.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CLASS_SETS = ("doclaynet", "publaynet")


def _names(spec: str) -> list[str]:
    from gsdistill.tuples.labels import DOCLAYNET_CLASSES, PUBLAYNET_CLASSES
    if spec == "doclaynet":
        return list(DOCLAYNET_CLASSES)
    if spec == "publaynet":
        return list(PUBLAYNET_CLASSES)
    return [n.strip() for n in spec.split(",") if n.strip()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gsdistill detect", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="COCO json / official release / synthetic pages -> Ultralytics data YAML")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--coco", help="a COCO layout json (with --images)")
    src.add_argument("--release", help="an official DocLayNet or PubLayNet release folder (with --dataset)")
    src.add_argument("--synthetic", type=int, metavar="N", help="N synthetic pages (gsdistill.tuples.sources.synthetic)")
    src.add_argument("--docbank", help="DocBank folder (token .txt + page images): tokens grouped into region boxes")
    src.add_argument("--shards", help="a page-tuple shard dir (gsdistill tuples build ...)")
    c.add_argument("--images", help="image folder of --coco")
    c.add_argument("--dataset", choices=CLASS_SETS, help="layout of --release")
    c.add_argument("--names", help="doclaynet | publaynet | comma-separated names (default: doclaynet, or the "
                   "release's own classes)")
    c.add_argument("--to-doclaynet", action="store_true", help="map PubLayNet classes onto DocLayNet's")
    c.add_argument("--split", choices=("train", "val", "test"), help="put all of --coco into this split")
    c.add_argument("--val-fraction", type=float, default=0.2)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--size", type=int, nargs=2, default=(612, 792), metavar=("W", "H"), help="synthetic page size")
    c.add_argument("--skip-missing", action="store_true", help="record missing images in the manifest, no error")
    c.add_argument("--out", required=True, help="output folder (images/, labels/, data.yaml); one holding a conversion "
                   "of other data is refused unless --overwrite")
    c.add_argument("--overwrite", action="store_true", help="replace a conversion of other data in --out (removes "
                   "only what detect convert wrote there: images/, labels/, coco/, data.yaml, manifest.json, ...)")

    for name, help_ in (("export", "write the untrained detector .pt (frozen ViT + pyramid + v10Detect)"),
                        ("train", "head-only fine-tuning with Ultralytics' trainer (resume=last.pt resumes; model= and resume= "
                                   ".pt files load weights_only unless safe_load=false: a .pt is a pickle, i.e. code)"),
                        ("val", "Ultralytics mAP + pycocotools COCOeval on the same predictions"),
                        ("predict", "boxes as JSON + drawn PNG per page of a pdf / image / folder")):
        s = sub.add_parser(name, help=help_)
        if name == "export":
            s.add_argument("--names", default="doclaynet", help="doclaynet | publaynet | comma-separated names")
            s.add_argument("--out", required=True, help="output .pt path")
        if name in ("val", "predict"):
            s.add_argument("weights", help="Ultralytics .pt (best.pt of a train run). WARNING: a .pt is a pickle; one "
                           "from an untrusted source is code. Loaded weights_only unless safe_load=false")
        if name == "val":
            s.add_argument("data_yaml")
            s.add_argument("--coco-json", help="score against this COCO json (default: the converter's sidecar)")
        if name == "predict":
            s.add_argument("source", help="a .pdf, an image, or a folder of them (sub-folders kept in the page names)")
            s.add_argument("--overwrite", action="store_true", help="replace predictions of another source or other "
                           "weights in predict.out (removes only the page .json/.png files predict wrote there)")
        s.add_argument("--config", help="experiment file in configs/detect/ (or a path)")
        s.add_argument("overrides", nargs="*", help="key=value config overrides")
    return p


def _inputs(args) -> list[tuple[str, str]]:
    """What convert reads: --out may neither be, lie in nor hold any of it."""
    given = (("--coco", args.coco), ("--images", args.images), ("--release", args.release),
             ("--docbank", args.docbank), ("--shards", args.shards))
    return [(label, path) for label, path in given if path]


def _source(args) -> str:
    """What --synthetic / --docbank / --shards pages are converted from, as the manifest records it."""
    if args.synthetic is not None:
        return f"synthetic: {args.synthetic} pages, seed {args.seed}, {args.size[0]}x{args.size[1]}"
    kind, path = ("docbank", args.docbank) if args.docbank else ("shards", args.shards)
    return f"{kind}: {Path(path).resolve()}"


def _page_source(args):
    """Page tuples of --synthetic / --docbank / --shards (boxes already in DocLayNet classes)."""
    if args.docbank:
        from gsdistill.tuples.sources.docbank import docbank_pages
        return docbank_pages(args.docbank)
    if args.shards:
        from gsdistill.tuples.store.reader import read_pages
        return read_pages(args.shards, embeddings=False)
    from gsdistill.tuples.sources.synthetic import generate_pages
    return generate_pages(args.synthetic, seed=args.seed, width=args.size[0], height=args.size[1])


def _convert(args) -> int:
    from gsdistill.tuples.labels import PUBLAYNET_TO_DOCLAYNET
    from gsdistill.detect import convert
    from gsdistill.output_folder import check_output_dir

    check_output_dir(args.out, "--out", inputs=_inputs(args))  # before any source is opened or a byte written
    names = _names(args.names or ("doclaynet" if args.to_doclaynet or not args.dataset else args.dataset))
    cmap = PUBLAYNET_TO_DOCLAYNET if args.to_doclaynet else None
    missing = "skip" if args.skip_missing else "error"
    if args.coco:
        if not args.images:
            raise convert.DatasetError("--coco needs --images (the folder its file_name entries are in)")
        path = convert.coco_to_yolo(args.coco, args.images, args.out, names, split=args.split,
                                    val_fraction=args.val_fraction, seed=args.seed, category_map=cmap,
                                    missing_images=missing, overwrite=args.overwrite)
    elif args.release:
        if not args.dataset:
            raise convert.DatasetError("--release needs --dataset doclaynet|publaynet")
        path = convert.convert_release(args.release, args.dataset, args.out, names=names,
                                       category_map=cmap, missing_images=missing, overwrite=args.overwrite)
    else:
        path = convert.pages_to_yolo(_page_source(args), args.out, val_fraction=args.val_fraction, seed=args.seed,
                                     names=names, source=_source(args), overwrite=args.overwrite,
                                     inputs=_inputs(args))
    manifest = json.loads((Path(args.out) / "manifest.json").read_text())
    for split, st in manifest["splits"].items():
        print(f"{split}: {st['images']} images, {st['boxes']} boxes, {len(st['skipped'])} skipped, "
              f"{len(st.get('clipped', []))} clipped to the image")
    for js, st in manifest.get("unknown_image_annotations", {}).items():
        print(f"{st['count']} annotations of {js} skipped: their image_id is not in its 'images' "
              "(ids in manifest.json, unknown_image_annotations)")
    print(f"data YAML: {path}")
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from gsdistill.config import ConfigError
    from gsdistill.detect.convert import DatasetError
    try:
        if args.command == "convert":
            return _convert(args)
        from gsdistill.config import load_config
        cfg = load_config("detect", args.config, args.overrides)  # config errors before the heavy imports
        from gsdistill.detect import pipeline
        from gsdistill.threads import apply_threads
        apply_threads(cfg.threads, int(cfg.workers), ultralytics=True)
        if args.command == "export":
            path = pipeline.export_detector(cfg.backbone, _names(args.names), cfg, args.out)
            info = json.loads(path.with_name("params.json").read_text())
            print(f"exported {path}: {info['params_total']:,} parameters, {info['params_trainable']:,} trainable")
        elif args.command == "train":
            from gsdistill.errors import run_training_command
            # a non-finite loss: one line, exit code 1 (as every training command), no checkpoint from it
            return run_training_command("gsdistill detect train", lambda: _train(pipeline, cfg))
        elif args.command == "val":
            report = pipeline.validate(args.weights, args.data_yaml, args.coco_json, cfg)
            print(format_report(report))
        else:
            from gsdistill.detect.predict import predict
            out = predict(args.weights, args.source, cfg.predict.out, cfg, overwrite=args.overwrite)
            print(f"{len(out)} pages -> {cfg.predict.out}/ (<page>.json, <page>.png)")
    except ConfigError:
        raise  # reported by gsdistill.cli with exit code 2
    except (DatasetError, FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"gsdistill detect {args.command}: {e}", file=sys.stderr)
        return 2
    return 0


def _train(pipeline, cfg) -> int:
    run = pipeline.train_head(cfg)
    print(f"run dir: {run} (weights/best.pt, results.csv, params.json)")
    return 0


def format_report(report: dict) -> str:
    """The val report as a small text table (overall, then per class)."""
    def f(v):
        return "  -  " if v is None else f"{100 * v:5.1f}"
    lines = [f"params: {report['params_total']:,} total, {report['params_trainable']:,} trainable",
             f"{'':16} {'mAP50':>6} {'mAP50-95':>9} {'COCO50':>7} {'COCO50-95':>10}",
             f"{'all':16} {f(report['mAP50']):>6} {f(report['mAP50-95']):>9} "
             f"{f(report['coco_mAP50']):>7} {f(report['coco_mAP50-95']):>10}"]
    for name, ap in report["per_class"].items():
        lines.append(f"{name:16} {f(ap['AP50']):>6} {f(ap['AP50-95']):>9} "
                     f"{f(ap.get('coco_AP50')):>7} {f(ap.get('coco_AP50-95')):>10}")
    if report.get("images_skipped"):
        lines.append(f"skipped {report['images_skipped']} images that do not decode (listed in "
                     f"{Path(report['save_dir']) / 'report.json'})")
    return "\n".join(lines)
