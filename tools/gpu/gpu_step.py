"""Issue "step" on a GPU: the whole torch-engine step, old revision vs this tree, side by side on one
device, eager and compiled, with its share of the bf16 peak and its top kernels. One lease, one call.

Each variant is a worker process that builds the engine from its own tree (``load_config``,
``GSDistill``, ``TorchEngine``: the public API both trees share), loads the SAME batches
(``bench_step.shared_batch``: random pages, iBOT masks drawn by the views pipeline's generator; three
maskings cycled so that a compiled step meets changing row counts) onto the device with its tree's
``to_device``, and answers ``step`` (forward, backward, clip, fused AdamW, EMA, timed between two
device syncs: the step the training loop runs, minus data loading), ``flops`` (counted per page with
``torch.utils.flop_counter``), ``profile`` (top kernels under ``torch.profiler``). Paired variants
take turns step by step (order alternating) so both see the same device state; ratios come with a
95 % bootstrap interval over the paired steps. Parts run in order of importance and the report is
rewritten after each, so a lease that ends early still returns what finished:

1. old vs new, eager, at ``--batch`` pages (the issue's baseline: 64);
2. FLOPs per page of each tree, the share of the bf16 peak, the top kernels of each;
3. the training loop's own step (``Trainer._one_step``: the side-stream copy of uint8 crops from
   pinned memory, the loop's reads and checks) vs the bare engine step, on the same batches with no
   DataLoader: what the loop adds, apart from data workers competing for the cores;
4. new at the recipe's batch (128), eager;
5. for each ``--compile-variants`` entry (``train.compile_scope`` and ``train.compile_mode``, e.g. ``step``,
   ``blocks``, ``step+reduce-overhead``): new compiled (inductor) vs new eager, on the batches padded to
   the run's bounds as the training stream pads them: the first steps with a fresh inductor cache (the
   cold compile), the graphs compiled (one shape: no recompile), the paired steady-state ratio, then
   the first steps of a second process on the same cache (the warm compile); abandoned past
   ``--compile-budget`` seconds.

    python tools/gpu/gpu_step.py --old-tree DIR [--batch 64] [--steps 20] [--out DIR]
    (on the CPU, for the tool's own test: --device cpu --experiment "" --override ... --backend aot_eager)
"""
from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parent  # tools/gpu
sys.path.insert(0, str(TOOLS.parents[1]))  # the checkout's root
sys.path.insert(0, str(TOOLS.parent / "bench"))  # bench_step
sys.path.insert(0, str(TOOLS))  # gpu_check

from bench_step import paired_interval, shared_batch  # noqa: E402
from gpu_check import bf16_peak  # noqa: E402

from gsdistill.config import load_config  # noqa: E402
from gsdistill.pretrain.config_checks import check_backbone  # noqa: E402
from gsdistill.views.fixed_shapes import pad_batch, run_shapes  # noqa: E402


def patch_size(cfg) -> int:
    return check_backbone(dict(cfg["model"]["backbone"]))


class Worker:
    """One variant in its own process (its own tree first on ``sys.path``)."""

    def __init__(self, tree: Path, args, overrides: list[str], files: list[Path], backend: str = "inductor"):
        tree = tree.resolve()
        cmd = [sys.executable, str(TOOLS / "gpu_step_worker.py"), str(tree), args.experiment,
               json.dumps([*args.override, *overrides]), json.dumps([str(f) for f in files]), args.device, backend]
        path = [str(tree), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
        self.source = self.read(600)["ready"]
        if not self.source.startswith(str(tree)):
            raise RuntimeError(f"the worker for {tree} imported gsdistill from {self.source}")

    def read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            raise TimeoutError(f"no answer in {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, what: str, timeout: float = 600) -> dict:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


def paired(a: Worker, b: Worker, steps: int, warmup: int = 3, what_b: str = "step") -> tuple[list[float], list[float]]:
    """Step times of ``a`` and ``b`` (``b`` answering ``what_b``; ``a`` and ``b`` may be one worker),
    taking turns (order alternating), after ``warmup`` steps each."""
    for _ in range(warmup):
        a.ask("step"), b.ask(what_b)
    ta, tb = [], []
    for i in range(steps):
        for first in ((True, False) if i % 2 == 0 else (False, True)):
            (ta if first else tb).append((a.ask("step") if first else b.ask(what_b))["s"])
    return ta, tb


def ratio_cell(base: list[float], other: list[float]) -> str:
    lo, hi = paired_interval(base, other)
    return f"{statistics.median(other) / statistics.median(base):.2f}x [{lo:.2f}, {hi:.2f}]"


# the eager workers say so: `train.compile: auto` compiles a run as long as gpu_vit_s16's on one GPU
# (in the first lease with it, the "eager" worker of part 1 was compiled)
EAGER = ["train.compile=false"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-tree", type=Path, required=True, help="the old revision unpacked (git archive 7cef4c0)")
    ap.add_argument("--experiment", default="gpu_vit_s16", help='pretraining experiment ("": the defaults)')
    ap.add_argument("--override", nargs="*", default=[], help="config overrides for every variant")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--recipe-batch", type=int, default=128, help="part 3's batch (0: skip)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant and pair")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend of part 4 (aot_eager in tests)")
    ap.add_argument("--compile-budget", type=float, default=240, help="seconds for part 5's first steps (0: skip)")
    ap.add_argument("--compile-variants", default="step,blocks",
                    help="part 5's compiled workers, comma-separated train.compile_scope[+train.compile_mode] "
                         "(e.g. step,blocks,step+reduce-overhead); each compiled cold, then again warm")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_step"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = load_config("pretrain", args.experiment or None, args.override)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_step_"))  # batches: ~80 MB each at 64 pages, kept out of --out
    files = {}
    for n in {args.batch, args.recipe_batch} - {0}:
        files[n] = [tmp / f"batch{n}_{s}.pt" for s in range(3)]
        for seed, f in enumerate(files[n]):
            torch.save(shared_batch(cfg, n, seed=seed), f)
    peak, peak_source = bf16_peak(args.device != "cuda")  # gpu_check's: spec sheet, else measured
    res: dict = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                 "torch": torch.__version__, "batch": args.batch, "steps": args.steps, "peak": peak,
                 "peak_source": peak_source, "parts": {}}

    def save() -> None:
        (args.out / "gpu_step.json").write_text(json.dumps(res, indent=1))
        (args.out / "gpu_step.md").write_text(report(res))

    def part(name: str, fn) -> None:
        start = time.perf_counter()
        try:
            res["parts"][name] = fn()
        except Exception as err:  # a part that fails is reported; the next part still runs
            res["parts"][name] = {"error": f"{type(err).__name__}: {err}"}
        res["parts"][name]["seconds"] = time.perf_counter() - start
        print(f"[gpu_step] {name}: {time.perf_counter() - start:.1f} s", flush=True)
        save()

    repo = TOOLS.parents[1]  # this checkout
    new = {}

    def old_vs_new() -> dict:
        old = Worker(args.old_tree, args, [], files[args.batch])
        new["eager"] = Worker(repo, args, EAGER, files[args.batch])
        t_old, t_new = paired(old, new["eager"], args.steps)
        out = {"old_s": statistics.median(t_old), "new_s": statistics.median(t_new), "ratio": ratio_cell(t_old, t_new),
               "old_flops": old.ask("flops")["flops"], "new_flops": new["eager"].ask("flops")["flops"],
               "old_gib": old.ask("memory")["gib"], "new_gib": new["eager"].ask("memory")["gib"],
               "old_profile": old.ask("profile"), "new_profile": new["eager"].ask("profile")}
        old.close()
        return out

    part("old vs new, eager", old_vs_new)

    def loop_vs_engine() -> dict:
        engine_s, loop_s = paired(new["eager"], new["eager"], args.steps, warmup=2, what_b="loop")
        return {"engine_s": statistics.median(engine_s), "loop_s": statistics.median(loop_s),
                "ratio": ratio_cell(engine_s, loop_s)}
    if "eager" in new:
        part("training loop vs engine step (new, eager)", loop_vs_engine)
    if args.recipe_batch:
        def recipe() -> dict:
            w = Worker(repo, args, EAGER, files[args.recipe_batch])
            times = [w.ask("step")["s"] for _ in range(args.steps + 3)][3:]
            out = {"s": statistics.median(times), "gib": w.ask("memory")["gib"], "flops": w.ask("flops")["flops"]}
            w.close()
            return out
        part(f"new eager, batch {args.recipe_batch}", recipe)
    if args.compile_budget > 0 and "eager" in new:
        # padded to the run's bounds, as the training stream pads every batch: one shape, one compile
        padded = [tmp / f"padded{args.batch}_{s}.pt" for s in range(len(files[args.batch]))]
        shapes = run_shapes(cfg, args.batch, (int(cfg["views"]["global_size"]) // patch_size(cfg),) * 2)
        for src, dst in zip(files[args.batch], padded):
            torch.save(pad_batch(torch.load(src, weights_only=True), shapes)[0], dst)
        eager = Worker(repo, args, EAGER, padded)
        for variant in args.compile_variants.split(","):
            scope, _, mode = variant.partition("+")
            overrides = ["train.compile=true", f"train.compile_scope={scope}", f"train.compile_mode={mode or 'default'}",
                         f"train.compile_cache={tmp / 'inductor' / variant}"]  # cold: a fresh folder

            def compiled(overrides=overrides) -> dict:
                start = time.perf_counter()

                def first_steps(w: Worker) -> list[float]:  # each batch once, within the budget
                    return [w.ask("step", timeout=max(1.0, start + args.compile_budget - time.perf_counter()))["s"]
                            for _ in padded]
                w = Worker(repo, args, overrides, padded, backend=args.backend)
                first = first_steps(w)
                t_eager, t_comp = paired(eager, w, args.steps, warmup=1)
                out = {"first_steps_s": first, "start_to_steady_s": time.perf_counter() - start,
                       "eager_s": statistics.median(t_eager), "compiled_s": statistics.median(t_comp),
                       "ratio": ratio_cell(t_eager, t_comp), "gib": w.ask("memory")["gib"],
                       "graphs": w.ask("graphs")["graphs"], "profile": w.ask("profile")}
                w.close()
                warm = Worker(repo, args, overrides, padded, backend=args.backend)  # a second run: the folder is warm
                out["warm_first_steps_s"] = first_steps(warm)
                warm.close()
                return out
            part(f"new compiled ({args.backend}, {variant}) vs eager", compiled)
        eager.close()
    for w in new.values():
        w.close()
    shutil.rmtree(tmp, ignore_errors=True)
    print(report(res))
    return 0


def report(res: dict) -> str:
    lines = [f"# Issue step on {res['device']} (torch {res['torch']})", "",
             f"Whole torch-engine steps (forward, backward, clip, fused AdamW, EMA; no data loading), bf16 "
             f"peak {res['peak'] / 1e12:.0f} TFLOP/s ({res['peak_source']}); medians of {res['steps']} paired steps.", ""]
    p = res["parts"]
    for name, part in p.items():
        lines.append(f"## {name} ({part.get('seconds', 0):.0f} s)")
        if "error" in part:
            lines += [f"failed: {part['error']}", ""]
            continue
        if "old_s" in part:
            b = res["batch"]
            lines += ["| tree | s/step | pages/s | GFLOP/page | share of bf16 peak | peak GiB | kernels/step |",
                      "|---|---:|---:|---:|---:|---:|---:|"]
            for k in ("old", "new"):
                s, f = part[f"{k}_s"], part[f"{k}_flops"]
                lines.append(f"| {k} | {s:.4f} | {b / s:.0f} | {f / 1e9:.1f} | {f * b / s / res['peak']:.1%} "
                             f"| {part[f'{k}_gib']:.1f} | {part[f'{k}_profile']['kernels_per_step']:.0f} |")
            lines += ["", f"new / old step time: **{part['ratio']}**", ""]
            for k in ("old", "new"):
                top = "; ".join(f"`{n[:60]}` {s:.1%}" for n, s in part[f"{k}_profile"]["top"])
                lines += [f"Top kernels ({k}, {part[f'{k}_profile']['device_ms_per_step']:.1f} ms device time "
                          f"per step): {top}", ""]
        elif "loop_s" in part:
            lines += [f"engine step {part['engine_s']:.4f} s, the loop's step (uint8 crops copied from pinned memory "
                      f"on the side stream, the loop's reads and checks; no DataLoader) {part['loop_s']:.4f} s: "
                      f"loop / engine **{part['ratio']}**", ""]
        elif "compiled_s" in part:
            b, f = res["batch"], part["profile"]
            warm = ", ".join(f"{s:.1f}" for s in part.get("warm_first_steps_s", []))
            lines += [f"first steps (compile, cold cache): {', '.join(f'{s:.1f}' for s in part['first_steps_s'])} s; "
                      f"a second process (warm cache): {warm or '-'} s; graphs compiled {part.get('graphs', '?')}; "
                      f"eager {part['eager_s']:.4f} s, compiled {part['compiled_s']:.4f} s ({b / part['compiled_s']:.0f} "
                      f"pages/s), compiled / eager **{part['ratio']}**, peak {part['gib']:.1f} GiB, "
                      f"{f['kernels_per_step']:.0f} kernels/step, {f['device_ms_per_step']:.1f} ms device time/step", ""]
        else:
            n = int(name.rsplit(" ", 1)[-1])
            lines += [f"{part['s']:.4f} s/step, {n / part['s']:.0f} pages/s, "
                      f"{part['flops'] * n / part['s'] / res['peak']:.1%} of the bf16 peak, peak {part['gib']:.1f} GiB", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
