"""Old vs new pretraining step, side by side in one run: forward+backward time and counted FLOPs.

Issue "step" asks for the model's forward+backward at <= 0.7x of an earlier revision's on the same
batch. This tool unpacks that revision (``git archive``, default 7cef4c0) into a temporary folder and
starts two worker processes, one importing each tree. Both build the same configuration (the
real-page recipe's pretraining from ``configs/demo/pdfs.yaml`` and ``gpu_vit_s16``), load the SAME
batch from one file (random pages with iBOT masks drawn by the views pipeline's own mask
generator, so both see identical inputs and masks) and then take turns: one step of the old, one
of the new, ... so both see the same machine load. Each step is ``model(batch)["total"].backward()``
(no optimizer, EMA or data movement: the part the issue measures). Reported per model: median step
times, as the workers' process CPU time (with the default 1 torch thread this is the step's own
work, robust to other jobs on a shared machine) and as wall time, each new/old ratio with a 95%
bootstrap interval over the paired steps, and the FLOPs per page each tree counts with
``torch.utils.flop_counter`` on that batch.

    python tools/bench/bench_step.py [--old 7cef4c0] [--models pdfs,gpu_vit_s16] [--pages 2] [--steps 12] [--masks mean]
                               [--compile new]   # the new tree compiled (train.compile) before its timed steps
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gsdistill.config import load_config  # noqa: E402
from gsdistill.pretrain.data_stream import host_indices, tensor_batch  # noqa: E402

# Each worker: build the model from its own tree, load the shared batch, answer "step" with one timed
# forward+backward, "flops" with the counted FLOPs per page. Same code for both trees (their public
# API: load_config, GSDistill(cfg), model(batch)["total"]).
WORKER = r"""
import json, sys, time, torch
from torch.utils.flop_counter import FlopCounterMode
sys.path.insert(0, sys.argv[1])
torch.set_num_threads(int(sys.argv[4]))
from gsdistill.config import load_config
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.losses import validation
validation.set_checks(False)  # as the training loop does after its first step
cfg = load_config("pretrain", sys.argv[2] or None, json.loads(sys.argv[3]))
torch.manual_seed(0)
model = GSDistill(cfg).train()
batch = torch.load(sys.argv[5], weights_only=True)
# --precision recipe: the forward under the recipe's own train.precision (bf16 autocast on the CPU too)
bf16 = sys.argv[6] == "recipe" and cfg["train"]["precision"] == "bf16"
# --compile new: this worker compiles the whole forward as the engine does (train.compile), the row
# counts of a new masking marked dynamic
compiled = sys.argv[7] == "1"
if compiled:  # only the new tree is compiled: its own engine's helpers
    from torch._dynamo import maybe_mark_dynamic
    from gsdistill.pretrain.data_stream import HOST_INDICES
    from gsdistill.pretrain.engine_torch import compile_step
    compile_step(model)
    for key in HOST_INDICES:
        maybe_mark_dynamic(batch[key], 0)
def step():
    model.zero_grad(set_to_none=True)
    t, c = time.perf_counter(), time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        total = model(batch)["total"]
    total.backward()
    return time.perf_counter() - t, time.process_time() - c
if compiled:  # the compile is the first step's; timed apart from the steps
    t = time.perf_counter()
    step()
    compile_s = time.perf_counter() - t
else:
    compile_s = 0.0
print(json.dumps({"ready": True, "compile_s": compile_s}), flush=True)
for line in sys.stdin:
    if line.strip() == "step":
        wall, cpu = step()
        print(json.dumps({"s": wall, "cpu": cpu}), flush=True)
    elif line.strip() == "flops":
        with FlopCounterMode(display=False) as counter:  # .forward: the eager code, compiled or not
            model.forward(batch)["total"].backward()
        print(json.dumps({"flops": counter.get_total_flops() / len(batch["sem_emb"])}), flush=True)
"""

MODELS = {  # name -> (experiment, where its overrides come from)
    "pdfs": (None, "configs/demo/pdfs.yaml"),
    "gpu_vit_s16": ("gpu_vit_s16", None),
    "demo": (None, None),
}


def overrides_of(name: str) -> list[str]:
    _, source = MODELS[name]
    if source is None:
        return []
    from omegaconf import OmegaConf
    return [str(o) for o in OmegaConf.load(REPO / source)["pretrain"]]


def shared_batch(cfg, pages: int, seed: int = 0, mean_masks: bool = False) -> dict:
    """``tensor_batch`` with the recipe's span count: random normalised crops, unit text embeddings and
    iBOT masks drawn as the views pipeline draws them (``mean_masks``: the average masking, whose FLOPs
    are a training step's expected FLOPs). Only tensors and a list of ids: loadable with
    ``weights_only=True`` by both trees."""
    batch = tensor_batch(cfg, pages, seed, n_texts=int(cfg["views"]["max_spans"]) // 2, mean_masks=mean_masks)
    return {**batch, **host_indices(batch["masks"])}  # as the loop's to_device adds them (an old tree ignores them)


class Worker:
    def __init__(self, tree: Path, name: str, batch_file: Path, threads: int, precision: str = "fp32",
                 compiled: bool = False):
        experiment, _ = MODELS[name]
        cmd = [sys.executable, "-c", WORKER, str(tree), experiment or "", json.dumps(overrides_of(name)),
               str(threads), str(batch_file), precision, "1" if compiled else "0"]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree)
        self.compile_s = self.read()["compile_s"]

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, what: str) -> dict:
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def paired_interval(old: list[float], new: list[float], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of median(new) / median(old) over paired steps."""
    rng = np.random.default_rng(seed)
    o, n = np.asarray(old), np.asarray(new)
    picks = rng.integers(0, len(o), size=(reps, len(o)))
    ratios = np.median(n[picks], axis=1) / np.median(o[picks], axis=1)
    return float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))


def bench(name: str, old_tree: Path, pages: int, steps: int, threads: int, tmp: Path, precision: str = "fp32",
          mean_masks: bool = False, compile_new: bool = False) -> dict:
    experiment, _ = MODELS[name]
    cfg = load_config("pretrain", experiment, overrides_of(name))
    batch_file = tmp / f"{name}.pt"
    torch.save(shared_batch(cfg, pages, mean_masks=mean_masks), batch_file)
    workers = {"old": Worker(old_tree, name, batch_file, threads, precision),
               "new": Worker(REPO, name, batch_file, threads, precision, compiled=compile_new)}
    try:
        times = {"old": [], "new": []}
        cpu = {"old": [], "new": []}
        for i in range(steps + 2):  # two warm-up steps each; the order alternates every step
            for key in (("old", "new") if i % 2 == 0 else ("new", "old")):
                answer = workers[key].ask("step")
                if i >= 2:
                    times[key].append(answer["s"])
                    cpu[key].append(answer["cpu"])
        flops = {k: w.ask("flops")["flops"] for k, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {"model": name, "old_s": med["old"], "new_s": med["new"], "ratio": med["new"] / med["old"],
            "ratio_ci": list(paired_interval(times["old"], times["new"])),
            "old_cpu_s": med_cpu["old"], "new_cpu_s": med_cpu["new"], "cpu_ratio": med_cpu["new"] / med_cpu["old"],
            "cpu_ratio_ci": list(paired_interval(cpu["old"], cpu["new"])), "new_compile_s": workers["new"].compile_s,
            "old_gflop_per_page": flops["old"] / 1e9, "new_gflop_per_page": flops["new"] / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", default="7cef4c0", help="git revision to compare with")
    parser.add_argument("--models", default="pdfs,gpu_vit_s16", help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument("--pages", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12, help="timed steps of each tree (after 2 warm-up steps)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of each worker (1: the process CPU time is the step's work, "
                             "robust to other jobs on a shared machine)")
    parser.add_argument("--precision", choices=("fp32", "recipe"), default="fp32",
                        help="fp32: every model in fp32; recipe: under its recipe's train.precision (bf16 autocast "
                             "for gpu_vit_s16, also on the CPU, where AMX / AVX512-BF16 run it)")
    parser.add_argument("--masks", choices=("drawn", "mean"), default="drawn",
                        help="drawn: iBOT masks drawn as the views pipeline draws them (seed 0); mean: the average "
                             "masking (mask_prob of the views, each at the middle of mask_ratio), whose FLOPs are a "
                             "training step's expected FLOPs")
    parser.add_argument("--compile", choices=("none", "new"), default="none",
                        help="new: the new tree's worker compiles its whole forward (train.compile, inductor) before "
                             "the timed steps; the old tree stays eager, as it trained")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        old_tree = tmp / "old"
        old_tree.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.old], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
        print(f"torch {torch.__version__}, {args.threads} threads, {args.pages} pages, {args.steps} paired steps, "
              f"precision {args.precision}, {args.masks} masks, new {'compiled' if args.compile == 'new' else 'eager'}; "
              f"old = {args.old}, new = working tree")
        print("| model | old s/step (CPU) | new s/step (CPU) | new / old CPU time [95% CI] | new / old wall [95% CI] "
              "| old GFLOP/page | new GFLOP/page | new / old FLOPs |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name in args.models.split(","):
            r = bench(name, old_tree, args.pages, args.steps, args.threads, tmp, args.precision, args.masks == "mean",
                      args.compile == "new")
            results.append(r)
            print(f"| {name} | {r['old_cpu_s']:.3f} | {r['new_cpu_s']:.3f} | {r['cpu_ratio']:.2f}x "
                  f"[{r['cpu_ratio_ci'][0]:.2f}, {r['cpu_ratio_ci'][1]:.2f}] | {r['ratio']:.2f}x [{r['ratio_ci'][0]:.2f}, "
                  f"{r['ratio_ci'][1]:.2f}] | {r['old_gflop_per_page']:.1f} | {r['new_gflop_per_page']:.1f} | "
                  f"{r['new_gflop_per_page'] / r['old_gflop_per_page']:.2f}x |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
