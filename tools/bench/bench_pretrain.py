"""Pretraining step benchmark: time breakdown, full step vs bare compute, FLOP/s vs this machine's matmul.

For each model (the demo ViT of configs/pretrain/default.yaml and ViT-S/16 with the paper's crops):

1. per-step breakdown from ``torch.profiler`` labels (data, student/teacher forwards, each loss
   term, backward, optimizer, EMA), averaged over the profiled steps;
2. host syncs per training step (``gsdistill.losses.syncs.HostSyncCounter``: every value read
   back and every data-dependent shape, as they would be on a GPU), with the losses' value checks
   off after the first step as the loop does. Goal: <= 2 (the loop's two reads: the loss terms
   before the update, the norms after it);
3. side by side in one run: the full training step (``Trainer`` with logging, finite checks,
   schedules, EMA; batches already in memory) vs the bare compute it cannot avoid: every
   student forward+backward the objective needs (with ``objective.align_views: unmasked`` the
   second, unmasked pass over the global views that the alignment heads read) and the teacher
   forward, through the same backbone and heads on the same views, with no losses, EMA,
   optimizer, logging or data movement (goal: full / bare <= 1.2), for each ``align_views``
   choice of ``--align-views`` (their full steps side by side), and the full step with
   ``train.compile=true`` (a compile failure is reported as a line);
4. model FLOP/s of the step (FLOPs counted by ``torch.utils.flop_counter`` on the bare compute,
   divided by the full step time) as a share of the measured fp32 matmul FLOP/s;
5. the data pipeline's time per batch (shards -> views -> collate) on synthetic pages, when the
   data package is available.

Every goal ends as a ``PASS: ...`` or ``FAIL: ...`` line.

    python tools/bench/bench_pretrain.py [--steps 4] [--pages 4] [--models demo,vit_s16] [--no-compile]
                                   [--align-views unmasked,visible]
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
from gsdistill.losses import validation
from gsdistill.losses.syncs import HostSyncCounter
from gsdistill.models.gsdistill_model import GSDistill, masked_patch_index
from gsdistill.models.view_batch import masked_view_index, normalize_crops, whole_view_rows, with_unmasked_copies
from gsdistill.models.vit_encoder import encode_views
from gsdistill.pretrain.data_stream import FixedBatches, host_indices, tensor_batch
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
    """Every student forward+backward and the teacher forward the objective runs, on the same views
    and heads; no losses. As in the step: one student call per crop size (with
    ``objective.align_views: unmasked`` the global call also takes unmasked copies of the masked
    views, which the alignment heads read), the teacher on the views it sees, and one call of each
    self-distillation head per network."""
    glob, local, masks = normalize_crops(batch["global_crops"]), normalize_crops(batch["local_crops"]), batch["masks"]
    copies = masked_view_index(masks) if model.align_views == "unmasked" else None
    h_all, p_all = encode_views(model.backbone, *with_unmasked_copies(glob, masks, copies), model.mask_token,
                                with_patches=True)
    h, patches = h_all[:glob.shape[0]], p_all[:glob.shape[0]]
    h_align, p_align = h, patches
    if copies is not None and copies.numel():
        rows = whole_view_rows(glob.shape[0], copies)
        h_align, p_align = h_all.index_select(0, rows), p_all.index_select(0, rows)
    h_local = encode_views(model.backbone, local)[0]
    index = masked_patch_index(masks)
    outs = [o for o in model._head_logits(model, torch.cat([h, h_local]), patches.flatten(0, 1)[index])]
    for name, head in model.align.items():
        outs += [head.embed_pages(model.head_inputs(h_align, p_align, glob.shape[-2:], name)),
                 head.embed_text(model._texts(batch, name)[0])]
    with torch.no_grad():
        t_h, t_patches = encode_views(model.teacher["backbone"], glob, with_patches=True)
        t_local = encode_views(model.teacher["backbone"], local)[0]
        model._head_logits(model.teacher, torch.cat([t_h, t_local]), t_patches.flatten(0, 1)[index])
    sum(o.float().sum() for o in outs).backward()
    model.zero_grad(set_to_none=True)


def run_steps(trainer: Trainer, n: int) -> None:
    trainer.plan.stop_after = trainer.step + n
    trainer.fit()


def breakdown(trainer: Trainer, steps: int) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_steps(trainer, steps)
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key.startswith("gsdistill."):
            times[event.key[len("gsdistill."):]] = event.cpu_time_total / 1e6 / steps
    return times


def verdict(ok: bool, what: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}: {what}")


def make_trainer(name: str, pages: int, run_dir: Path, compiled: bool,
                 align_views: str = "unmasked") -> tuple[Trainer, GSDistill, dict, object]:
    experiment, extra = MODELS[name]
    cfg = load_config("pretrain", experiment, COMMON + extra + [f"optim.batch_size={pages}", "optim.steps=1000",
                                                                 f"train.compile={str(compiled).lower()}",
                                                                 f"objective.align_views={align_views}"])
    torch.manual_seed(0)
    model = GSDistill(cfg)
    batch = tensor_batch(cfg, pages, seed=0, patch_size=int(model.backbone.patch_embed.patch_size[0]))
    engine = TorchEngine(model, cfg, torch.device("cpu"))
    return Trainer(cfg, run_dir, engine, FixedBatches([batch])), model, batch, cfg


def add_mask_index(trainer: Trainer) -> None:
    for batch in trainer.batches.batches:
        batch.update(host_indices(batch["masks"]))


def count_syncs(trainer: Trainer) -> HostSyncCounter:
    """One step's host syncs; AdamW's step counters live on the CPU on every device: not counted."""
    states = trainer.engine.optimizer.state.values()
    steps = [s["step"] for s in states if isinstance(s.get("step"), torch.Tensor) and s["step"].device.type == "cpu"]
    with HostSyncCounter(host_tensors=steps) as syncs:
        run_steps(trainer, 1)
    return syncs


def bench_model(name: str, steps: int, pages: int, run_root: Path, peak: float, with_compile: bool,
                variants: list[str]) -> None:
    trainer, model, batch, cfg = make_trainer(name, pages, run_root / name, False, variants[0])
    others = {v: make_trainer(name, pages, run_root / f"{name}-{v}", False, v) for v in variants[1:]}
    for other, *_ in others.values():
        add_mask_index(other)
        run_steps(other, 1)  # its first step, with value checks
    run_steps(trainer, 1)  # the first step runs with the losses' value checks, as in the loop
    validation.set_checks(False)  # ... which turns them off after it (each fit() restores this state)
    syncs_no_index = count_syncs(trainer)
    # the iBOT mask's flat indices, computed on the host as the data pipeline can (DINOv2's collate
    # does): spares the model's nonzero on the device
    add_mask_index(trainer)
    syncs = count_syncs(trainer)
    compiled, compile_error = None, None
    if with_compile:
        try:
            compiled = make_trainer(name, pages, run_root / f"{name}-compiled", True, variants[0])[0]
            add_mask_index(compiled)
            t = time.perf_counter()
            run_steps(compiled, 2)  # compiles (student, teacher, heads), then reuses
            compile_s = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 - a failed compile is a result, not a crash
            compiled, compile_error = None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    full_times, bare_times, comp_times = [], [], []
    side = {v: ([], []) for v in others}  # full, bare of each other align_views choice
    for _ in range(steps + 1):  # alternate, so all see the same machine load; the first warms up
        run_steps(trainer, 1)
        full_times.append(trainer.history[-1]["step_s"])
        t = time.perf_counter()
        bare_step(model, batch)
        bare_times.append(time.perf_counter() - t)
        for v, (other, other_model, other_batch, _) in others.items():
            run_steps(other, 1)
            side[v][0].append(other.history[-1]["step_s"])
            t = time.perf_counter()
            bare_step(other_model, other_batch)
            side[v][1].append(time.perf_counter() - t)
        if compiled is not None:
            run_steps(compiled, 1)
            comp_times.append(compiled.history[-1]["step_s"])
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
    for key in ("data", "student_global", "student_global_unmasked", "student_local", "teacher", "sem", "geom",
                "koleo", "distill", "ibot",
                "backward", "optimizer", "ema"):
        if key in parts:
            print(f"  {key:<24} {parts[key] * 1e3:9.1f} ms")
    print(f"host syncs per step  {syncs.total} with the batch's mask_index, {syncs_no_index.total} without "
          "(value checks off after step 1; AdamW's CPU step counters not counted; where:)")
    for where, n in syncs.where.most_common(8):
        print(f"  {n:3d}  {where}")
    print(f"full training step  {full * 1e3:9.1f} ms   (median of {steps})")
    print(f"bare compute        {bare * 1e3:9.1f} ms   ratio full/bare = {full / bare:.2f}x (goal <= 1.2x)"
          f"   [align_views={variants[0]}]")
    for v, (f_times, b_times) in side.items():
        f_v, b_v = statistics.median(f_times[1:]), statistics.median(b_times[1:])
        print(f"align_views={v:<9} full {f_v * 1e3:9.1f} ms, bare {b_v * 1e3:9.1f} ms, full/bare = {f_v / b_v:.2f}x; "
              f"full step {variants[0]} / {v} = {full / f_v:.2f}x, bare {variants[0]} / {v} = {bare / b_v:.2f}x")
    if compiled is not None:
        comp = statistics.median(comp_times[1:])
        print(f"compiled full step  {comp * 1e3:9.1f} ms   eager / compiled = {full / comp:.2f}x "
              f"(train.compile=true; first 2 steps incl. compiling: {compile_s:.1f} s)")
    elif compile_error:
        print(f"compiled full step  failed: {compile_error}")
    print(f"model FLOPs/step    {flops / 1e9:9.2f} GFLOP -> {flops / full / 1e9:.1f} GFLOP/s = "
          f"{100 * flops / full / peak:.1f}% of measured fp32 matmul ({peak / 1e9:.0f} GFLOP/s)")
    verdict(full / bare <= 1.2, f"{name} full / bare = {full / bare:.2f}x (goal <= 1.2x)")
    verdict(syncs.total <= 2, f"{name} host syncs per step = {syncs.total} (goal <= 2)")


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
    parser.add_argument("--no-compile", action="store_true", help="skip the train.compile=true timing")
    parser.add_argument("--align-views", default="unmasked,visible",
                        help="objective.align_views choices timed side by side (the first gets every measure)")
    args = parser.parse_args()
    peak = matmul_flops()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32 matmul {peak / 1e9:.0f} GFLOP/s")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name in args.models.split(","):
                bench_model(name, args.steps, args.pages, Path(tmp), peak, not args.no_compile,
                            args.align_views.split(","))
        finally:
            validation.set_checks(True)
        if not args.no_data:
            bench_data(args.pages, Path(tmp))


if __name__ == "__main__":
    main()
