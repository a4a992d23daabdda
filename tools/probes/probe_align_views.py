"""Learning probe for ``objective.align_views``: the same short pretraining run under each choice,
then training-page retrieval Acc@1 (geometric head: a page from its descriptors; semantic head: a
page from 1 of its spans), as in docs/learning.md "Self-distillation".

Synthetic pages in large print (the demo's data), cached all-MiniLM-L6-v2 embeddings (built once
into ``--data``, reused), the demo's recipe (3x3 grid heads, ``geom_target: mean``, symmetric,
ramped self-distillation, sharp teacher) at a smaller size so that a run fits in minutes on one
CPU thread. Each variant runs in its own process, one after the other, and prints one JSON line:

    python tools/probes/probe_align_views.py --data /tmp/probe_pages --variants unmasked,visible [--steps 300]

A variant may carry extra overrides after colons: ``visible:views.mask_prob=0.25``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RECIPE = ["model.geom_pool_grid=3", "model.sem_pool_grid=3", "objective.geom_target=mean", "objective.symmetric=true",
          "objective.momentum_base=0.95", "objective.momentum_end=0.995", "objective.teacher_temp=0.003",
          "objective.lambda_distill=0.35", "objective.lambda_ibot=0.35", "views.global_scale=[0.9,1.0]",
          "views.color_jitter=0.1", "optim.batch_size=16", "optim.lr=5e-4", "threads=1",
          "train.progress=false", "train.plots=false", "train.tensorboard=false", "train.ckpt_every=100000"]


def build_pages(folder: Path, n: int, seed: int) -> None:
    from gsdistill.tuples.store.writer import write_shards
    from gsdistill.tuples.sources.synthetic import generate_pages
    from gsdistill.models.text_encoder import DEFAULT_ENCODER, TextEncoder
    from gsdistill.tuples.embedding.stage import embed_shards
    if not (folder / "manifest.json").is_file():
        write_shards(generate_pages(n, seed=seed, width=512, height=640, text_scale=2.0), folder, total=n,
                     progress=False)
    embed_shards(folder, TextEncoder, DEFAULT_ENCODER, progress=False)


def run_variant(variant: str, data: Path, steps: int, size: int, out: Path) -> dict:
    import torch
    from gsdistill.config import load_config
    from gsdistill.eval.head_retrieval import head_retrieval
    from gsdistill.pretrain.checkpoint import load_pretrained
    from gsdistill.pretrain.run import run_pretraining
    from gsdistill.tuples.store.reader import read_pages
    from gsdistill.tuples.store.text_cache import open_embeddings

    torch.set_num_threads(1)
    overrides = RECIPE + [f"data.shards={data}", f"optim.steps={steps}", f"optim.warmup_steps={max(1, steps // 20)}",
                          f"objective.distill_warmup_steps={steps // 4}", f"views.global_size={size}",
                          f"train.log_every={max(1, steps // 10)}"]
    choice, *extra = variant.split(":")
    overrides += [f"objective.align_views={choice}", *extra]
    cfg = load_config("pretrain", None, overrides)
    torch.manual_seed(0)
    t = time.perf_counter()
    run = run_pretraining(cfg, out / variant.replace(":", "_").replace("=", "-"))
    wall = time.perf_counter() - t
    model = load_pretrained(run)
    pages = list(read_pages(data, embeddings=open_embeddings(data, required=True)))
    geom = head_retrieval(model, pages, "geom", size)
    sem = head_retrieval(model, pages, "sem", size, k=1)
    return {"variant": variant, "steps": steps, "pages": len(pages), "view_px": size, "train_s": round(wall, 1),
            "geom_acc1": geom["acc1"], "geom_ci95": geom["ci95"], "sem1_acc1": sem["acc1"],
            "geom_rank": geom["spread"]["effective_rank"], "chance": geom["chance"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--pages", type=int, default=128)
    parser.add_argument("--variants", default="unmasked,visible")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--out", type=Path, default=Path("/tmp/probe_align_views"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one variant in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_variant(args.one, args.data, args.steps, args.size, args.out)), flush=True)
        return
    build_pages(args.data, args.pages, seed=0)
    for variant in args.variants.split(","):
        subprocess.run([sys.executable, __file__, "--one", variant, "--data", str(args.data), "--steps",
                        str(args.steps), "--size", str(args.size), "--out", str(args.out)], check=True)


if __name__ == "__main__":
    main()
