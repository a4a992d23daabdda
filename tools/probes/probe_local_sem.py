"""Semantic retrieval from 5 text spans: page-view gallery vs span-crop gallery, for several pretraining runs.

    python tools/probes/probe_local_sem.py DEMO_DIR --model original=DEMO_DIR/pretrain --model local_sem=RUN \
        [--untrained DEMO_DIR/pretrain] [--out results.json]

Pages as ``gsdistill demo`` reads them (``DEMO_DIR/data/eval``: held-out documents; the first
``data.retrieval_train_pages`` of ``DEMO_DIR/data/train``); per model and split, Acc@1 with the
document bootstrap of :func:`gsdistill.eval.head_retrieval.head_retrieval` (page view at the run's
``views.global_size``, lse over texts as the demo) and of
:func:`gsdistill.eval.span_crop_retrieval.span_crop_retrieval` (mean and lse over texts), plus each
model's held-out difference to the first, paired over documents.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
import torch

from gsdistill.config import load_config
from gsdistill.eval.head_retrieval import bootstrap_by_document, head_retrieval
from gsdistill.eval.span_crop_retrieval import span_crop_retrieval
from gsdistill.pipelines.demo_learning import untrained_model
from gsdistill.pretrain.checkpoint import load_pretrained
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.store.text_cache import open_embeddings


def _splits(demo: Path) -> dict[str, list[dict]]:
    cfg = load_config("demo", demo / "config.yaml")
    data = demo / "data"
    return {"held-out": list(read_pages(data / "eval", embeddings=open_embeddings(data / "eval", required=True))),
            "training": list(itertools.islice(read_pages(data / "train", embeddings=open_embeddings(data / "train", required=True)),
                                              int(cfg.data.retrieval_train_pages)))}


def _cell(r: dict) -> dict:
    return {"acc1": r["acc1"], "ci95": r["ci95"], "chance": r["chance"], "n_pages": r["n_pages"], "hits": r["hits"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("demo", type=Path)
    ap.add_argument("--model", action="append", required=True, help="label=run_dir (the first is the reference)")
    ap.add_argument("--untrained", type=Path, help="a run dir whose architecture is drawn at random (chance control)")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    splits = _splits(args.demo)
    runs = [m.split("=", 1) for m in args.model]
    models = {label: (load_pretrained(Path(d)), Path(d)) for label, d in runs}
    if args.untrained:
        models["untrained"] = (untrained_model(args.untrained, args.seed + 1), args.untrained)
    rows = {}
    for label, (model, run) in models.items():
        size = int(load_config("pretrain", run / "config.yaml").views.global_size)
        for split, pages in splits.items():
            t0 = time.time()
            rows[label, split, "page view"] = _cell(head_retrieval(model, pages, "sem", size, k=args.k, seed=args.seed))
            for agg in ("mean", "lse"):
                r = span_crop_retrieval(model, pages, k=args.k, seed=args.seed, aggregation=agg)
                rows[label, split, f"span crops, {agg}"] = {**_cell(r), "crops_per_page": r["crops_per_page"]}
            print(f"{label} / {split}: {time.time() - t0:.0f} s", flush=True)
    docs = [str(p.get("doc_id") or p["id"]) for p in splits["held-out"]]
    print("\n| model | split | gallery | Acc@1 % [95 % CI] | chance % |\n|---|---|---|---:|---:|")
    for (label, split, gallery), c in rows.items():
        print(f"| {label} | {split} | {gallery} | {100 * c['acc1']:.1f} [{100 * c['ci95'][0]:.1f}, "
              f"{100 * c['ci95'][1]:.1f}] | {100 * c['chance']:.2f} |")
    ref = runs[0][0]
    print(f"\nheld-out differences to {ref} (paired over documents):")
    for (label, split, gallery), c in rows.items():
        if split == "held-out" and label != ref:
            diff = np.asarray(c["hits"]) - np.asarray(rows[ref, split, gallery]["hits"])
            lo, hi = bootstrap_by_document(diff, docs, 2000, args.seed)
            print(f"- {label} - {ref}, {gallery}: {100 * diff.mean():+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] points")
    if args.out:
        args.out.write_text(json.dumps({" / ".join(k): v for k, v in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
