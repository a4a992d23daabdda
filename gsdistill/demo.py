"""``gsdistill demo``: the whole mission in one path, as a new user meets it.

tuples -> text-embedding cache -> GSDistill pretraining (full objective) -> backbone export ->
head-only YOLOv10 fine-tuning -> detection val + drawn predictions -> crop-subsampled page
retrieval (k = 1, 5, 8) -> ``<out_dir>/report.md``. Each stage is the same library call its own
sub-command makes; the demo only wires them together (config: ``configs/demo/default.yaml``).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm import tqdm

from gsdistill.config import load_config, save_config, to_dict

STAGES = ["tuples", "embed", "pretrain", "detect", "retrieval", "report"]


def build_tuples(cfg, out: Path) -> tuple[Path, Path, dict]:
    """Train and held-out shard dirs (disjoint documents) and what was skipped on the way."""
    from gsdistill.data.shards import write_shards
    from gsdistill.data.synthetic import generate_pages

    d, train_dir, eval_dir = cfg.data, out / "data" / "train", out / "data" / "eval"
    if cfg.pdfs:
        from gsdistill.demo_pdfs import build_pdf_split
        info = build_pdf_split(Path(cfg.pdfs), out / "data", int(d.pdf_dpi), int(d.max_pdf_pages),
                               int(d.pages_per_pdf), float(d.eval_fraction), int(cfg.seed))
        return train_dir, eval_dir, info
    w, h = int(d.page_width), int(d.page_height)
    # held-out pages come from another synthetic set (another seed): no document is in both
    train = write_shards(generate_pages(int(d.train_pages), seed=int(cfg.seed), width=w, height=h),
                         train_dir, total=int(d.train_pages))
    held = write_shards(generate_pages(int(d.eval_pages), seed=int(cfg.seed) + 1000, width=w, height=h),
                        eval_dir, total=int(d.eval_pages))
    return train_dir, eval_dir, {"train": _manifest_summary(train), "eval": _manifest_summary(held)}


def _manifest_summary(m: dict) -> dict:
    return {k: m[k] for k in ("pages", "documents", "spans", "boxes_per_class", "skipped_count", "skip_reasons")}


def pretrain(cfg, train_dir: Path, out: Path) -> Path:
    from gsdistill.train.pretrain import run_pretraining

    pcfg = load_config("pretrain", None, [*cfg.pretrain, f"data.shards={train_dir}", f"train.seed={cfg.seed}"])
    return run_pretraining(pcfg, run_dir=out / "pretrain")


def detect(cfg, train_dir: Path, eval_dir: Path, backbone: Path, out: Path) -> dict:
    from gsdistill.data.shards import read_pages
    from gsdistill.detect.convert import pages_to_yolo
    from gsdistill.detect.evaluate import validate
    from gsdistill.detect.pipeline import train_head
    from gsdistill.detect.predict import predict

    data_yaml = pages_to_yolo(read_pages(train_dir), out / "detect" / "data",
                              val_fraction=float(cfg.data.detect_val_fraction), seed=int(cfg.seed))
    dcfg = load_config("detect", None, [*cfg.detect, f"backbone={backbone}", f"data={data_yaml}",
                                        f"project={out / 'detect'}", "name=head_only", f"seed={cfg.seed}"])
    run_dir = train_head(dcfg)
    weights = run_dir / "weights" / "best.pt"
    report = validate(weights, data_yaml, cfg=dcfg)
    pages_dir = out / "detect" / "heldout_pages"
    pages_dir.mkdir(parents=True, exist_ok=True)
    for i, page in zip(range(int(cfg.predict_pages)), read_pages(eval_dir)):
        page["image"].convert("RGB").save(pages_dir / f"page{i}.png")
    drawn = predict(weights, pages_dir, out / "detect" / "predictions", dcfg)
    report.update(run_dir=str(run_dir), weights=str(weights), predictions=[str(p.with_suffix(".png")) for p in drawn])
    return report


def retrieval(cfg, run_dir: Path, eval_dir: Path, out: Path) -> dict:
    from gsdistill.data.shards import read_pages
    from gsdistill.retrieval.page_report import write_report
    from gsdistill.retrieval.page_retrieval import evaluate_page_retrieval
    from gsdistill.train.checkpoint import load_pretrained

    ecfg = load_config("eval", None, [*cfg.eval, f"out_dir={out / 'retrieval'}"])
    model = load_pretrained(run_dir)
    section = to_dict(ecfg)["retrieval"]
    if section["image_size"] is None:  # the size the backbone was pretrained at
        section["image_size"] = int(load_config("pretrain", run_dir / "config.yaml").views.global_size)
    results = evaluate_page_retrieval(model, read_pages(eval_dir), cfg=section)
    files = write_report({"pretrained (full objective)": results}, out / "retrieval")
    return {"results": results, "files": {k: str(v) for k, v in files.items()}}


def run_demo(cfg) -> Path:
    """Run every stage; return the report path. Each stage's output stays in ``out_dir``."""
    from gsdistill.data.text_cache import embed_shards
    from gsdistill.demo_report import write_demo_report

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out)
    times, info = {}, {}
    bar = tqdm(STAGES, desc="demo", unit="stage", position=0)
    for stage in bar:
        bar.set_postfix_str(stage)
        t0 = time.time()
        if stage == "tuples":
            train_dir, eval_dir, info["data"] = build_tuples(cfg, out)
        elif stage == "embed":
            for d in (train_dir, eval_dir):
                embed_shards(d)
        elif stage == "pretrain":
            run_dir = pretrain(cfg, train_dir, out)
        elif stage == "detect":
            info["detect"] = detect(cfg, train_dir, eval_dir, run_dir / "backbone", out)
        elif stage == "retrieval":
            info["retrieval"] = retrieval(cfg, run_dir, eval_dir, out)
        else:
            times[stage] = time.time() - t0
            (out / "results.json").write_text(json.dumps({"times_s": times, **info}, indent=1, default=str))
            return write_demo_report(cfg, out, run_dir, info, times)
        times[stage] = time.time() - t0
    raise AssertionError("unreachable: the report stage returns")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gsdistill demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pdfs", help="folder of PDFs to use instead of the synthetic pages")
    p.add_argument("--size", default=None, help="experiment file of configs/demo/ (e.g. smoke)")
    p.add_argument("--out", help="output folder (default runs/demo)")
    p.add_argument("overrides", nargs="*", help="key=value overrides of configs/demo/default.yaml")
    args = p.parse_args(argv)
    extra = [f"pdfs={args.pdfs}"] if args.pdfs else []
    extra += [f"out_dir={args.out}"] if args.out else []
    cfg = load_config("demo", args.size, [*args.overrides, *extra])
    report = run_demo(cfg)
    print(f"report: {report}")
    return 0
