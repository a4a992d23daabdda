"""Pretraining step benchmark: time breakdown, full step vs bare compute, FLOP/s vs this machine's matmul.

For each model (the demo ViT of configs/pretrain/default.yaml and ViT-S/16 with the paper's crops):

1. per-step breakdown from ``torch.profiler`` labels (data, student/teacher forwards, each loss
   term, backward, optimizer, EMA), averaged over the profiled steps;
2. side by side in one run: the full training step (``Trainer`` with logging, finite checks,
   schedules, EMA; batches already in memory) vs the bare compute it cannot avoid: student
   forward+backward and teacher forward through the same backbone and heads on the same views,
   with no losses, EMA, optimizer, logging or data movement. Goal: full / bare <= 1.2;
3. model FLOP/s of the step (FLOPs counted by ``torch.utils.flop_counter`` on the bare compute,
   divided by the full step time) as a share of the measured fp32 matmul FLOP/s;
4. the data pipeline's time per batch (shards -> views -> collate) on synthetic pages, when the
   data package is available.

    python tools/bench_pretrain.py [--steps 4] [--pages 4] [--models demo,vit_s16]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from gsdistill.config import load_config
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.models.vit_encoder import encode_views
from gsdistill.pretrain.data_stream import FixedBatches, tensor_batch
from gsdistill.pretrain.engine_torch import TorchEngine
from gsdistill.pretrain.loop import Trainer

MODELS = {
    "demo": (None, []),
    "vit_s16": ("vit_small_paper", ["train.precision=fp32"]),
}
COMMON = ["train.progress=false", "train.plots=false", "train.ckpt_every=100000", "train.log_every=1"]


def matmul_flops(n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n ** 3 * reps / (time.perf_counter() - t)


def bare_step(model: GSDistill, batch: dict) -> None:
    """Student forward+backward and teacher forward on the same views and heads; no losses."""
    glob, local, masks = batch["global_crops"], batch["local_crops"], batch["masks"]
    h, patches = encode_views(model.backbone, glob, masks, model.mask_token, with_patches=True)
    h_local = encode_views(model.backbone, local)[0]
    outs = [model.dino_head(torch.cat([h, h_local])), model.dino_head(patches[masks])]
    for name, head in model.align.items():
        outs += [head.embed_pages(h), head.embed_text(batch[f"{name}_emb"])]
    with torch.no_grad():
        t_h, t_patches = encode_views(model.teacher["backbone"], glob, with_patches=True)
        t_local = encode_views(model.teacher["backbone"], local)[0]
        model.teacher["dino_head"](torch.cat([t_h, t_local]))
        model.teacher["dino_head"](t_patches[masks])
    sum(o.float().sum() for o in outs).backward()
    model.zero_grad(set_to_none=True)


def breakdown(trainer: Trainer, steps: int) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.cfg.train.stop_after = trainer.step + steps
        trainer.fit()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key.startswith("gsdistill."):
            times[event.key[len("gsdistill."):]] = event.cpu_time_total / 1e6 / steps
    return times


def bench_model(name: str, steps: int, pages: int, run_root: Path, peak: float) -> None:
    experiment, extra = MODELS[name]
    cfg = load_config("pretrain", experiment, COMMON + extra + [f"optim.batch_size={pages}", "optim.steps=1000"])
    torch.manual_seed(0)
    model = GSDistill(cfg)
    batch = tensor_batch(cfg, pages, seed=0, patch_size=int(model.backbone.patch_embed.patch_size[0]))
    engine = TorchEngine(model, cfg, torch.device("cpu"))
    trainer = Trainer(cfg, run_root / name, engine, FixedBatches([batch]))
    full_times, bare_times = [], []
    for _ in range(steps + 1):  # alternate, so both see the same machine load; the first warms up
        trainer.cfg.train.stop_after = trainer.step + 1
        trainer.fit()
        full_times.append(trainer.history[-1]["step_s"])
        t = time.perf_counter()
        bare_step(model, batch)
        bare_times.append(time.perf_counter() - t)
    full, bare = statistics.median(full_times[1:]), statistics.median(bare_times[1:])
    with FlopCounterMode(display=False) as counter:
        bare_step(model, batch)
    flops = counter.get_total_flops()
    parts = breakdown(trainer, 2)
    n_params = sum(p.numel() for _, p in model.student_parameters())
    print(f"\n== {name}: {cfg.model.backbone.name} depth={cfg.model.backbone.depth}, {n_params / 1e6:.1f} M student "
          f"params, {pages} pages x ({cfg.views.n_global}x{cfg.views.global_size}px + "
          f"{cfg.views.n_local}x{cfg.views.local_size}px), DINO K={cfg.model.dino_out_dim}")
    print("per-step breakdown (profiler, inclusive CPU time; student_* include heads' forward only):")
    for key in ("data", "student_global", "student_local", "teacher", "sem", "geom", "koleo", "distill", "ibot",
                "backward", "optimizer", "ema"):
        if key in parts:
            print(f"  {key:<15} {parts[key] * 1e3:9.1f} ms")
    print(f"full training step  {full * 1e3:9.1f} ms   (median of {steps})")
    print(f"bare compute        {bare * 1e3:9.1f} ms   ratio full/bare = {full / bare:.2f}x (goal <= 1.2x)")
    print(f"model FLOPs/step    {flops / 1e9:9.2f} GFLOP -> {flops / full / 1e9:.1f} GFLOP/s = "
          f"{100 * flops / full / peak:.1f}% of measured fp32 matmul ({peak / 1e9:.0f} GFLOP/s)")


def bench_data(pages: int, run_root: Path) -> None:
    try:
        from gsdistill.pretrain.data_stream import ShardBatches
        from gsdistill.pretrain.run import prepare_synthetic
    except ImportError as e:
        print(f"\ndata pipeline: skipped ({e})")
        return
    cfg = load_config("pretrain", None, COMMON + [f"optim.batch_size={pages}", "data.synthetic_pages=32"])
    shard_dir = prepare_synthetic(cfg, run_root / "data")
    stream = ShardBatches(str(shard_dir), cfg, 0, 1, pages, 16)
    next(stream)
    t = time.perf_counter()
    for _ in range(4):
        next(stream)
    print(f"\ndata pipeline (demo views, {pages} pages/batch, 0 workers): "
          f"{(time.perf_counter() - t) / 4 * 1e3:.1f} ms per batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--pages", type=int, default=4)
    parser.add_argument("--models", default="demo,vit_s16")
    parser.add_argument("--no-data", action="store_true")
    args = parser.parse_args()
    peak = matmul_flops()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 matmul {peak / 1e9:.0f} GFLOP/s")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            bench_model(name, args.steps, args.pages, Path(tmp), peak)
        if not args.no_data:
            bench_data(args.pages, Path(tmp))


if __name__ == "__main__":
    main()
