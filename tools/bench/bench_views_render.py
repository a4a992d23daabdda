"""Time of the views made in the step (issue 56): one batch's pages and crop rows -> normalised views.

    python tools/bench/bench_views_render.py --device cuda --batch 128          # the GPU recipe's batch, compiled
    python tools/bench/bench_views_render.py --device cpu --batch 16 --recipe default --eager

Builds a batch as the stream sends it with ``views.device`` (synthetic pages of the recipe's size, their
crop rows drawn by ``BatchedViews``), then times ``view_pixels`` (cut, resize, jitter, grey, blur,
normalise) alone: eager, and compiled with inductor as the step compiles it (``--eager``: not compiled).
Prints the median of ``--repeats`` calls after warm-up, and the augmentation's share of a step of
``--step-ms`` (the bare compiled step, e.g. 93 ms at batch 128 on an H200: ../shared/gpu/h200_2026-11-28).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from gsdistill.config import load_config
from gsdistill.models.view_batch import view_pixels
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.views.batched_views import BatchedViews, encoded_png
from gsdistill.views.collate import collate_pretrain


def views_batch(recipe: str | None, batch: int, seed: int = 0) -> tuple[dict, tuple[int, int]]:
    cfg = load_config("pretrain", recipe)
    v, d = cfg.views, cfg.data
    views = BatchedViews.from_config(v, 16, seed=seed, canvas=(int(d.page_height), int(d.page_width)))
    pages = list(generate_pages(min(batch, 16), seed=seed, width=int(d.page_width), height=int(d.page_height),
                                text_scale=float(d.text_scale)))
    samples = []
    for i in range(batch):  # a few distinct pages, each drawn anew: other windows and factors
        page = dict(pages[i % len(pages)], id=f"page-{i}", image=encoded_png(pages[i % len(pages)]["image"]))
        page["sem_emb"] = page["geom_emb"] = np.zeros((1, 4), dtype=np.float32)
        samples.append(views(page))
    return collate_pretrain(samples), (int(v.global_size), int(v.local_size))


def timed(fn, batch: dict, device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn(batch)`` after two warm-up calls (a compile happens in the first)."""
    for _ in range(2):
        fn(batch)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="gpu_vit_s16", help="pretrain experiment (default: the GPU recipe; 'default')")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--eager", action="store_true", help="time the eager ops only")
    ap.add_argument("--step-ms", type=float, default=93.0, help="the step the share is taken of")
    args = ap.parse_args()
    device = torch.device(args.device)
    host, sizes = views_batch(None if args.recipe == "default" else args.recipe, args.batch)
    batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in host.items()}
    fn = lambda b: view_pixels(b, sizes)  # noqa: E731
    runs = {"eager": fn} if args.eager else {"eager": fn, "compiled": torch.compile(fn, fullgraph=True)}
    print(f"{args.recipe}: batch {args.batch}, pages {tuple(batch['pages'].shape)}, {batch['global_params'].shape[0]} "
          f"global + {batch['local_params'].shape[0]} local views, {device}")
    for name, run in runs.items():
        start = time.perf_counter()
        seconds = timed(run, batch, device, args.repeats)
        print(f"{name:<9} {1e3 * seconds:8.2f} ms a batch ({args.batch / seconds:,.0f} pages/s; "
              f"{100 * 1e3 * seconds / args.step_ms:.1f} % of a {args.step_ms:g} ms step; "
              f"{time.perf_counter() - start:.0f} s with warm-up)")


if __name__ == "__main__":
    main()
