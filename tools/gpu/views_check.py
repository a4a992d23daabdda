"""Issue 56's GPU check in one call: does the training loop, with the views made in the step, run at the
bare engine's speed? On one GPU, from the project root (on a lent machine: ``bash .gpu/on_device.sh python3
tools/gpu/views_check.py --out $OUT``; docs/gpu.md, "Views made on the GPU"):

1. ``--pages`` synthetic pages of ``gpu_vit_s16`` built and embedded once;
2. the bare engine step: one batch of the ``views.device=cuda`` stream resident on the device, the step
   (``TorchEngine``: forward with the views rendered inside it, backward, AdamW, EMA) timed between two
   device syncs, compiled as the run compiles it;
3. ``gsdistill pretrain gpu_vit_s16`` with ``views.device=cuda``, ``--batch`` pages a step, ``--workers``
   DataLoader workers, compiled, every step logged: per step ``step_s`` and ``data_s`` after ``--warmup``
   steps (the compile and the first queue refill);
4. the same run with ``views.device=cpu`` (albumentations in the workers), for the pages/s it reaches;
5. the render alone (``tools/bench/bench_views_render.py``) and its share of the bare step.

The report (``OUT/views_check.md``) is rewritten after each part, so a lease that ends early still
returns what finished; each target of the issue is a row with its verdict: median step <= 1.05x the
bare step, p90 <= 1.2x, median data wait <= 2 ms, no step above 3x the median.

    python tools/gpu/views_check.py --out DIR [--steps 260] [--warmup 40] [--batch 128] [--workers 8]
    python tools/gpu/views_check.py --device cpu --out DIR      # a tiny rehearsal on the CPU (the tool's test)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check (QUIET, TINY)

BARE = r"""
import json, sys, time
import torch
from gsdistill.config import load_config
from gsdistill.losses.validation import set_checks
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import ShardBatches, to_device
from gsdistill.pretrain.engine_torch import TorchEngine
shards, batch_size, steps, device, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
cfg = load_config("pretrain", "gpu_vit_s16", extra)
device = torch.device(device)
torch.manual_seed(0)
model = GSDistill(cfg)
stream = ShardBatches(shards, cfg, 0, 1, batch_size, int(model.backbone.patch_embed.patch_size[0]))
batch = to_device(next(stream), device)
engine = TorchEngine(model, cfg, device)
set_checks(False)  # the loop's first step is checked and eager; every step here is the compiled one
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
times = []
for _ in range(steps):
    sync()
    t0 = time.perf_counter()
    terms = engine.forward(batch)
    engine.backward_step(terms["total"], 1e-4)
    engine.update_teacher(0.996)
    sync()
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def child_env() -> dict:
    """The environment of a child process: this tree first on PYTHONPATH, what was there kept after it (on a
    lent machine ``on_device.sh`` puts the carried packages, ``/tmp/site``, there: dropping it drops them)."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *kept])}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


class Report:
    def __init__(self, out: Path):
        self.path, self.lines = out / "views_check.md", []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)
        self.path.write_text("\n".join(self.lines) + "\n")


def bare_step(shards: Path, args, extra: list[str]) -> list[float]:
    run = subprocess.run([sys.executable, "-c", BARE, str(shards), str(args.batch), str(args.bare_steps), args.device,
                          *extra], capture_output=True, text=True, cwd=ROOT, timeout=args.part_timeout,
                         env=child_env())
    if run.returncode:
        raise RuntimeError(f"bare step failed: {run.stderr.strip()[-1500:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])[args.bare_warmup:]


def loop_run(name: str, shards: Path, args, extra: list[str]) -> tuple[list[dict], float, str]:
    """(per-step rows after the warm-up, wall seconds, the log's last lines)."""
    from gsdistill.run_log import read_rows

    run_dir = args.out / "runs" / name
    cmd = [sys.executable, "-m", "gsdistill.cli", "pretrain", "gpu_vit_s16", "--run-dir", str(run_dir), "--overwrite",
           f"data.shards={shards}", f"optim.steps={args.steps}", "optim.warmup_steps=5", "train.engine=torch",
           f"optim.batch_size={args.batch}", f"data.num_workers={args.workers}", *extra]
    start = time.time()
    log = args.out / f"{name}.log"
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, timeout=args.part_timeout,
                                env=child_env()).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    tail = " / ".join(log.read_text().strip().splitlines()[-2:])[:300]
    rows = read_rows(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else []
    return [r for r in rows if int(float(r["step"])) > args.warmup], time.time() - start, f"exit {rc}: {tail}"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/views_check")))
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a tiny rehearsal")
    ap.add_argument("--pages", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=260, help="loop steps per run (the first --warmup are not timed)")
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--bare-steps", type=int, default=60)
    ap.add_argument("--bare-warmup", type=int, default=10)
    ap.add_argument("--part-timeout", type=float, default=420, help="seconds a part may take before it is abandoned")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = args.device == "cpu"
    from gpu_check import QUIET, TINY

    from gsdistill.config import load_config
    from gsdistill.pretrain.run import prepare_synthetic

    tiny = [*TINY[:-1], "train.device=cpu", "train.precision=fp32"] if cpu else []  # TINY's last: num_workers=0
    report = Report(args.out)
    t0 = time.time()
    data = load_config("pretrain", "gpu_vit_s16", [f"data.synthetic_pages={args.pages}", "train.progress=false",
                                                   *tiny, f"data.num_workers={max(1, args.workers)}"])
    shards = prepare_synthetic(data, args.out / "data")
    report.say(f"# views.device on {args.device} (issue 56): {args.pages} pages built and embedded in "
               f"{time.time() - t0:.0f} s; batch {args.batch}, {args.workers} workers, {args.steps} steps a run, "
               f"the first {args.warmup} untimed")
    compiled = ["train.compile=false" if cpu else "train.compile=true"]  # inductor on a CPU: minutes of compiling
    extra = [*tiny, *compiled, "views.device=batched" if cpu else "views.device=cuda"]

    bare = bare_step(shards, args, [*tiny, *compiled, extra[-1], "data.num_workers=0"])  # one batch, read here
    bare_ms = 1e3 * statistics.median(bare)
    report.say(f"\nbare engine step (one resident batch, {compiled[0]}): median {bare_ms:.1f} ms, p90 "
               f"{1e3 * percentile(bare, 0.9):.1f} ms over {len(bare)} steps")

    report.say("\n| run | steps timed | step median ms | x bare | p90 x bare | max x median | data wait median ms "
               "| pages/s | wall s | exit |")
    report.say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    results = {}
    step_views = extra[-1].split("=")[1]  # cuda; batched in a CPU rehearsal (the same path)
    for name, views in ((step_views, extra[-1]), ("cpu", "views.device=cpu")):
        rows, wall, note = loop_run(name, shards, args, [*tiny, *QUIET, *compiled, views])
        if not rows:
            report.say(f"| {name} | 0 | | | | | | | {wall:.0f} | {note} |")
            continue
        steps = [float(r["step_s"]) for r in rows]
        waits = [float(r["data_s"]) for r in rows]
        med = statistics.median(steps)
        results[name] = {"median": med, "p90": percentile(steps, 0.9), "max": max(steps),
                         "wait": statistics.median(waits)}
        report.say(f"| {name} | {len(rows)} | {1e3 * med:.1f} | {1e3 * med / bare_ms:.3f} | "
                   f"{1e3 * percentile(steps, 0.9) / bare_ms:.3f} | {max(steps) / med:.2f} | "
                   f"{1e3 * statistics.median(waits):.2f} | {args.batch / med:.0f} | {wall:.0f} | {note.split(':')[0]} |")
    if step_views in results:
        r = results[step_views]
        report.say(f"\n| target (views.device={step_views}) | measured | verdict |")
        report.say("|---|---:|---|")
        report.say(f"| median step <= 1.05x bare | {1e3 * r['median'] / bare_ms:.3f}x | "
                   f"{verdict(1e3 * r['median'] <= 1.05 * bare_ms)} |")
        report.say(f"| p90 <= 1.2x bare | {1e3 * r['p90'] / bare_ms:.3f}x | {verdict(1e3 * r['p90'] <= 1.2 * bare_ms)} |")
        report.say(f"| median data wait <= 2 ms | {1e3 * r['wait']:.2f} ms | {verdict(r['wait'] <= 2e-3)} |")
        report.say(f"| no step above 3x the median | {r['max'] / r['median']:.2f}x | {verdict(r['max'] <= 3 * r['median'])} |")

    render = [sys.executable, str(ROOT / "tools" / "bench" / "bench_views_render.py"), "--device", args.device,
              "--batch", str(args.batch if not cpu else 4), "--step-ms", f"{bare_ms:.1f}"] + \
             (["--recipe", "default", "--eager"] if cpu else [])
    try:
        out = subprocess.run(render, capture_output=True, text=True, cwd=ROOT, timeout=args.part_timeout,
                             env=child_env())
        report.say("\nthe render alone (tools/bench/bench_views_render.py):\n")
        report.say("\n".join(f"    {line}" for line in (out.stdout + out.stderr).strip().splitlines()[-4:]))
    except subprocess.TimeoutExpired:
        report.say("\nthe render alone: abandoned past --part-timeout")


if __name__ == "__main__":
    main()
