"""``gsdistill demo``: the whole mission in one path, with the controls that show it learned.

tuples -> text-embedding cache -> GSDistill pretraining -> the same run with the backbone frozen at
random (the control) -> head-only YOLOv10 on the pretrained and on a random backbone, and a stock
YOLOv10n, same budget, several seeds, held-out pages -> page retrieval from each page's own texts
through both heads (held-out and training pages, document-level bootstrap) -> ``<out_dir>/report.md``.
Each stage is the library call its own sub-command makes; the demo only wires them together
(config: ``configs/demo/default.yaml``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import yaml
from tqdm import tqdm

from gsdistill.config import load_config, save_config
from gsdistill.output_manifest import Layout

STAGES = ["tuples", "embed", "pretrain", "control", "detect", "detect budgets", "human labels", "retrieval", "report"]
PRETRAINED, CONTROL, UNTRAINED = "pretrained", "random backbone, heads trained", "random (untrained)"


def build_tuples(cfg, out: Path) -> tuple[Path, Path, dict]:
    """Train and held-out shard dirs (disjoint documents) and what was skipped on the way; synthetic
    pages are built on every core, the training pages in a shard or more per pretraining reader."""
    from gsdistill.tuples.builder.synthetic_sets import build_synthetic

    d, train_dir, eval_dir = cfg.data, out / "data" / "train", out / "data" / "eval"
    if labelled(cfg):  # pages people labelled: OCR'd scans pretrain, their boxes go to detection alone
        from gsdistill.pipelines.labelled_pages import build_labelled_split
        readers = max(1, int(pretrain_config(cfg, train_dir).data.num_workers))
        return build_labelled_split(cfg, out, readers)
    if cfg.pdfs:
        from gsdistill.pipelines.demo_pdfs import build_pdf_split
        info = build_pdf_split(Path(cfg.pdfs), out / "data", int(d.pdf_dpi), int(d.max_pdf_pages),
                               int(d.pages_per_pdf), float(d.eval_fraction), int(cfg.seed))
        return train_dir, eval_dir, {**info, **_detect_extra(cfg, out)}
    page = dict(width=int(d.page_width), height=int(d.page_height), text_scale=float(d.text_scale))
    readers = max(1, int(pretrain_config(cfg, train_dir).data.num_workers))
    train = build_synthetic(int(d.train_pages), train_dir, seed=int(cfg.seed), readers=readers, **page)
    # held-out pages come from another synthetic set (another seed): no document is in both
    held = build_synthetic(int(d.eval_pages), eval_dir, seed=int(cfg.seed) + 1000, **page)
    return train_dir, eval_dir, {"train": _manifest_summary(train), "eval": _manifest_summary(held), **_detect_extra(cfg, out)}


def _detect_extra(cfg, out: Path) -> dict:
    """The pages of ``detect_extra_pdfs`` (detection heads only) in ``out/data/detect_extra``; {} without it."""
    if not cfg.detect_extra_pdfs:
        return {}
    from gsdistill.pipelines.demo_pdfs import build_detect_extra

    d = cfg.data
    return {"detection-only pages (detect_extra_pdfs)": build_detect_extra(
        Path(cfg.detect_extra_pdfs), extra_dir(out), int(d.pdf_dpi), int(d.max_pdf_pages), int(d.pages_per_pdf),
        pdfs=Path(cfg.pdfs) if cfg.pdfs else None)}


def labelled(cfg) -> bool:
    """Whether the demo runs on labelled pages (``demo --coco`` / ``--release``)."""
    return bool(cfg.labelled.coco or cfg.labelled.release)


def extra_dir(out: Path) -> Path:
    return out / "data" / "detect_extra"


def _manifest_summary(m: dict) -> dict:
    return {k: m[k] for k in ("pages", "documents", "spans", "boxes_per_class", "skipped_count", "skip_reasons")}


def pretrain_config(cfg, train_dir: Path, *extra: str):
    return load_config("pretrain", cfg.pretrain_experiment, [*cfg.pretrain, f"data.shards={train_dir}", f"train.seed={cfg.seed}", *extra])


def pretrain(cfg, train_dir: Path, out: Path, name: str = "pretrain", *extra: str, overwrite: bool = False) -> Path:
    from gsdistill.pretrain.run import run_pretraining
    return run_pretraining(pretrain_config(cfg, train_dir, *extra), run_dir=out / name, overwrite=overwrite)


# what a finished or started demo leaves in its folder: a rerun would replace its runs and report
EARLIER_DEMO = ("report.md", "results.json", "pretrain/config.yaml", "control/config.yaml", "pretrain/checkpoints")


# the top-level names a demo writes (its stages' folders included)
DEMO_WRITES = ("config.yaml", "report.md", "results.json", "data", "pretrain", "control", "detect", "detect_budgets",
               "human_labels")
DEMO = Layout("gsdistill demo", DEMO_WRITES,
              ("config.yaml", "report.md", "results.json", "data/**", "pretrain/**", "control/**", "detect/**",
               "detect_budgets/**", "human_labels/**"), EARLIER_DEMO,
              (("report.md", "results.json"), ("pretrain/checkpoints/latest",), ("pretrain/config.yaml",
                                                                                  "pretrain/metrics.csv")))


def demo_inputs(cfg) -> list[tuple[str, Path]]:
    """The folders and files a demo reads (never inside its ``--out``)."""
    named = [("--pdfs", cfg.pdfs), ("detect_extra_pdfs", cfg.detect_extra_pdfs), ("human_labels", cfg.human_labels)]
    return [(k, Path(str(v))) for k, v in named if v]


def check_demo_folder(out: Path, overwrite: bool, inputs: list[tuple[str, Path]] = ()) -> None:
    """Refuse (one line, exit 2) an output folder that is a file, holds one of ``inputs`` (the PDFs, the
    recipe), holds an earlier demo or files gsdistill did not write, before any stage runs;
    ``overwrite`` lets every stage replace what it wrote there (and only that)."""
    from gsdistill.output_folder import OutputConflict, check_claim, check_output_dir
    from gsdistill.output_removal import describe
    check_output_dir(out, "demo --out", inputs)
    inv = check_claim(out, "demo --out", DEMO, overwrite, fresh=False)
    found = [name for name in EARLIER_DEMO if name in inv.ours]
    if found and not overwrite:
        raise OutputConflict(f"demo --out {out}: holds an earlier demo ({describe(found)}); choose another folder "
                             "(--out), or pass --overwrite to run it again there (each stage replaces only what it "
                             "wrote)")
    check_claim(out, "demo --out", DEMO, overwrite)


def detect(cfg, train_dir: Path, eval_dir: Path, backbone: Path, out: Path, data_yaml: str | None = None) -> dict:
    """Head-only detection on the pretrained and a random backbone plus stock YOLOv10n, same budget,
    ``detect_seeds``; trained on pretraining pages, scored on held-out pages (pycocotools); ``paired``:
    pretrained minus random backbone (and minus the reference) with a bootstrap over held-out documents.
    ``data_yaml``: detection data made beforehand (labelled pages: their own boxes); None = the pages' own boxes."""
    from gsdistill.tuples.store.reader import read_manifest, read_pages
    from gsdistill.detect.compare import compare_backbones, summarize
    from gsdistill.detect.convert import pages_to_yolo
    from gsdistill.detect.map_bootstrap import rows_bootstrap
    from gsdistill.detect.predict import predict
    from gsdistill.pipelines.demo_pdfs import same_steps_overrides

    from gsdistill.tuples.labels import LABEL_SETS

    n_train = cfg.data.detect_train_pages  # null: every pretraining page trains the heads
    n_pre = read_manifest(train_dir)["pages"]
    n_pre = n_pre if n_train is None else min(int(n_train), n_pre)
    n_extra = read_manifest(extra_dir(out))["pages"] if cfg.detect_extra_pdfs else 0
    if data_yaml is None:
        pages = itertools.chain(itertools.islice(read_pages(train_dir), n_pre),
                                read_pages(extra_dir(out)) if n_extra else (), read_pages(eval_dir))
        held = {p["doc_id"] for p in read_pages(eval_dir, decode_images=False)}
        names, category_map = LABEL_SETS[str(cfg.detect_labels)]
        data_yaml = pages_to_yolo(pages, out / "detect" / "data", val_docs=held, names=names, category_map=category_map)
    else:
        from gsdistill.detect.subset import train_images
        names = list(yaml.safe_load(Path(data_yaml).read_text())["names"].values())
        n_pre = train_images(data_yaml)
    overrides = [*cfg.detect]
    if n_extra:  # more documents at the budget the pretraining pages alone get: epochs (and warm-up) scaled down
        overrides += same_steps_overrides(load_config("detect", "compare", overrides), n_pre, n_pre + n_extra)
    dcfg = load_config("detect", "compare", overrides)
    rows = compare_backbones(data_yaml, {PRETRAINED: backbone, "random backbone": None}, seeds=list(cfg.detect_seeds),
                             cfg=dcfg, out_dir=out / "detect")
    # B - A on the same held-out pages, documents resampled: the intervals every detection claim of the report uses
    paired = {"backbone": rows_bootstrap(rows, data_yaml, "random backbone", PRETRAINED, seed=int(cfg.seed),
                                         per_class=True)}
    if cfg.detect_reference:  # the reference column: fewer seeds, it only sets the scale
        reference = f"{cfg.detect_reference} (stock, all layers trained)"
        rcfg = load_config("detect", "compare", [*overrides, *cfg.detect_reference_overrides])
        rcfg.val_during_training = bool(cfg.detect_reference_curve)  # per-epoch held-out mAP: the learning curve only
        ref_rows = compare_backbones(data_yaml, {reference: str(cfg.detect_reference)},
                                     seeds=list(cfg.detect_reference_seeds), cfg=rcfg, out_dir=out / "detect" / "reference")
        rows += [{**r, "curve": bool(cfg.detect_reference_curve)} for r in ref_rows]
        paired["reference"] = rows_bootstrap(rows, data_yaml, reference, PRETRAINED, seed=int(cfg.seed))
    pages_dir = out / "detect" / "heldout_pages"
    pages_dir.mkdir(parents=True, exist_ok=True)
    for i, page in zip(range(int(cfg.predict_pages)), read_pages(eval_dir)):
        page["image"].convert("RGB").save(pages_dir / f"page{i}.png")
    first = next(r for r in rows if r["backbone"] == PRETRAINED)
    pcfg = dcfg.copy()
    pcfg.predict.conf = float(cfg.predict_conf)
    # the demo's own folder: a demo run again replaces the predictions of the one before
    drawn = predict(Path(first["run_dir"]) / "weights" / "last.pt", pages_dir, out / "detect" / "predictions", pcfg,
                    overwrite=True)
    return {"rows": rows, "summary": summarize(rows), "paired": paired, "data_yaml": str(data_yaml), "labels": names,
            "overrides": [str(o) for o in overrides], "train_pages": {"pretraining": n_pre, "extra": n_extra},
            "reference_overrides": [str(o) for o in cfg.detect_reference_overrides] if cfg.detect_reference else [],
            "head": head_name(dcfg),
            "predict_conf": float(cfg.predict_conf), "predictions": [str(p.with_suffix(".png")) for p in drawn]}


def head_name(dcfg) -> str:
    """What the head-only detectors train on top of the frozen ViT, in the report's words."""
    neck = "YOLOv10's neck + " if str(dcfg.adapter_neck) == "pan" else ""
    return f"a simple feature pyramid of {int(dcfg.adapter_channels)} channels + {neck}v10Detect"


def human_labels(cfg, det: dict, out: Path) -> dict | None:
    """The trained detectors on pages with human layout labels (``human_labels``: a folder holding
    ``docbank_samples/`` and/or ``publaynet_examples/``; ``gsdistill.pipelines.human_labels``)."""
    from gsdistill.pipelines.human_labels import convert_sets, score_on_human_labels

    if not cfg.human_labels:
        return None
    sets = convert_sets(Path(cfg.human_labels), out / "human_labels" / "data", str(cfg.detect_labels))
    if not sets:
        raise FileNotFoundError(f"human_labels: no docbank_samples/ or publaynet_examples/ under {cfg.human_labels}")
    rows = [r for r in det["rows"] if r["backbone"] in (PRETRAINED, "random backbone")]
    rows += [r for r in det["rows"] if r["backbone"] not in (PRETRAINED, "random backbone")]
    dcfg = load_config("detect", "compare", [*cfg.detect])
    return score_on_human_labels(rows, sets, dcfg, out / "human_labels", "random backbone", PRETRAINED,
                                 seed=int(cfg.seed))


def retrieval(cfg, run_dir: Path, control_dir: Path | None, train_dir: Path, eval_dir: Path) -> dict:
    """Both heads, three models, training and held-out pages (``gsdistill.pipelines.demo_learning``)."""
    from gsdistill.tuples.store.reader import read_pages
    from gsdistill.tuples.store.text_cache import open_embeddings
    from gsdistill.pipelines.demo_learning import measure, teacher_logit_spread, untrained_model
    from gsdistill.pretrain.checkpoint import load_pretrained

    models = {PRETRAINED: load_pretrained(run_dir)}
    if control_dir is not None:
        models[CONTROL] = load_pretrained(control_dir)
    models[UNTRAINED] = untrained_model(run_dir, int(cfg.seed) + 1)
    splits = {"held-out": list(read_pages(eval_dir, embeddings=open_embeddings(eval_dir, required=True))),
              "training": list(itertools.islice(read_pages(train_dir, embeddings=open_embeddings(train_dir, required=True)),
                                                int(cfg.data.retrieval_train_pages)))}
    size = int(load_config("pretrain", run_dir / "config.yaml").views.global_size)
    rows = measure(models, splits, size, seed=int(cfg.seed))
    docs = {s: [str(p.get("doc_id") or p["id"]) for p in pages] for s, pages in splits.items()}
    spread = teacher_logit_spread(models[PRETRAINED], splits["held-out"], size)  # why DINO does (not) leave log K
    return {"rows": rows, "image_size": size, "doc_ids": docs, "teacher_spread": spread}


def check_demo_config(cfg, out: Path) -> None:
    """The values of every stage that pretrains, before the first page is made (one line, exit 2)."""
    from gsdistill.pretrain.config_checks import check_pretrain_config, check_synthetic_pages

    if labelled(cfg):  # the labelled pages, their documents and classes: read and checked
        from gsdistill.pipelines.labelled_pages import read_inputs
        read_inputs(cfg)
    elif not cfg.pdfs:
        check_synthetic_pages(cfg.data.page_width, cfg.data.page_height, cfg.data.text_scale)
    check_pretrain_config(pretrain_config(cfg, out / "data" / "train"), shards_made_later=True)


def run_demo(cfg, overwrite: bool = False, config_files: list[Path] = ()) -> Path:
    """Run every stage; return the report path. Each stage's output stays in ``out_dir``, which holds
    this process's lock; a folder holding an earlier demo (or files gsdistill did not write) is refused
    unless ``overwrite``; one holding what the demo reads (``config_files``: its recipe) always."""
    from gsdistill.output_folder import lock_folder

    out = Path(cfg.out_dir)
    check_demo_config(cfg, out)
    check_demo_folder(out, overwrite, demo_inputs(cfg) + [("--size", Path(f)) for f in config_files])
    with lock_folder(out):
        return _run_stages(cfg, out, overwrite)


def _run_stages(cfg, out: Path, overwrite: bool) -> Path:
    from gsdistill.models.text_encoder import TextEncoder
    from gsdistill.tuples.embedding.stage import embed_shards
    from gsdistill.tuples.store.text_cache import fields_for
    from gsdistill.pipelines.demo_report import write_demo_report

    save_config(cfg, out)
    times, info, control_dir = {}, {}, None
    bar = tqdm(STAGES, desc="demo", unit="stage", position=0)
    for stage in bar:
        bar.set_postfix_str(stage)
        t0 = time.time()
        if stage == "tuples":
            train_dir, eval_dir, info["data"] = build_tuples(cfg, out)
        elif stage == "embed":  # in the descriptor format pretraining uses (its cache key)
            pcfg = pretrain_config(cfg, train_dir)
            for d in (train_dir, eval_dir):
                embed_shards(d, TextEncoder, str(pcfg.model.text_encoder), descriptor_format=pcfg.data.descriptor_format,
                             fields=fields_for(pcfg.objective.positives))
        elif stage == "pretrain":
            run_dir = pretrain(cfg, train_dir, out, overwrite=overwrite)
        elif stage == "control":
            if cfg.control:
                control_dir = pretrain(cfg, train_dir, out, "control", "model.freeze_backbone=true", overwrite=overwrite)
        elif stage == "detect":
            info["detect"] = detect(cfg, train_dir, eval_dir, run_dir / "backbone", out,
                                    (info["data"].get("labelled") or {}).get("data_yaml"))
        elif stage == "detect budgets":  # few labels, few epochs (demo_budgets); nothing when none are asked
            from gsdistill.pipelines.demo_budgets import detect_budgets
            info["detect_budgets"] = detect_budgets(cfg, info["detect"]["data_yaml"], run_dir / "backbone", out,
                                                    info["detect"]["overrides"])
        elif stage == "human labels":
            info["human_labels"] = human_labels(cfg, info["detect"], out)
        elif stage == "retrieval":
            info["retrieval"] = retrieval(cfg, run_dir, control_dir, train_dir, eval_dir)
        else:
            times[stage] = time.time() - t0
            (out / "results.json").write_text(json.dumps({"times_s": times, **info}, indent=1, default=str))
            return write_demo_report(cfg, out, run_dir, control_dir, info, times)
        times[stage] = time.time() - t0
    raise AssertionError("unreachable: the report stage returns")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gsdistill demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pdfs", help="folder of PDFs to use instead of the synthetic pages")
    p.add_argument("--coco", help="COCO json of pages people labelled: pretrained on as unlabelled scans (OCR), "
                   "their boxes train the detection heads and score them on held-out documents")
    p.add_argument("--images", help="folder of the --coco json's images")
    p.add_argument("--release", help="an official DocLayNet or PubLayNet release folder instead of --coco/--images")
    p.add_argument("--dataset", choices=["doclaynet", "publaynet"], help="the kind of --release")
    p.add_argument("--doc-key", help="image field naming each page's document (default: source_book, else "
                   "doc_name, else the file name's prefix before its last '_')")
    p.add_argument("--class-map", help="coarse (each name's part before ':') or a YAML/JSON file of "
                   "{source name: target name or null} (default: the set's own names)")
    p.add_argument("--workers", type=int, help="processes copying and OCRing the labelled images (default: all cores)")
    p.add_argument("--size", default=None, help="experiment file of configs/demo/ (smoke, pdfs, pdfs_long, labelled, "
                   "gpu; default: pdfs with --pdfs, labelled with --coco or --release, else none)")
    p.add_argument("--out", help="output folder (default runs/demo)")
    p.add_argument("--overwrite", action="store_true",
                   help="run again in a folder holding an earlier demo (each stage replaces only what it wrote)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of configs/demo/default.yaml")
    args = p.parse_args(argv)
    extra = [f"pdfs={args.pdfs}"] if args.pdfs else []
    extra += [f"out_dir={args.out}"] if args.out else []
    given = {"coco": args.coco, "images": args.images, "release": args.release, "dataset": args.dataset,
             "doc_key": args.doc_key, "class_map": args.class_map, "workers": args.workers}
    extra += [f"labelled.{k}={v}" for k, v in given.items() if v is not None]
    if args.coco and args.release:
        p.error("--coco and --release: give one of them")
    has_labels = bool(args.coco or args.release)
    if has_labels and args.pdfs:
        p.error("--pdfs and --coco/--release: give one source of pages")
    # real pages need the real-page recipe (configs/demo/pdfs.yaml): the default one is sized for large print
    size = args.size if args.size is not None else ("pdfs" if args.pdfs else "labelled" if has_labels else None)
    if size is not None:
        named = "/" in size or size.endswith((".yaml", ".yml"))  # --size takes a path as well as a name
        print(f"demo recipe: {size if named else f'configs/demo/{size}.yaml'}", flush=True)
    cfg = load_config("demo", size, [*args.overrides, *extra])
    from gsdistill.threads import apply_threads
    apply_threads(cfg.threads, ultralytics=True)  # before any torch work; the detect stage runs in this process
    from gsdistill.config import experiment_files
    report = run_demo(cfg, overwrite=args.overwrite, config_files=experiment_files("demo", size))
    print(f"report: {report}")
    return 0
