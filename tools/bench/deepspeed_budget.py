"""Where a DeepSpeed step's time goes, measured on the CPU beside the torch engine's (issue 58, item 1).

Each engine runs in its own worker process (DeepSpeed's ZeRO-3 rewrites modules in place), on the
same model and the same batches, round robin over ``--rounds`` so every engine sees the same machine
load; per step the worker times the phases the engine exposes:

* torch engine: ``forward``, ``backward`` and ``optimizer`` (clip + fused AdamW), as TorchEngine does them;
* DeepSpeed: ``forward`` (with ZeRO-3's gather / release hooks), ``backward`` (with the gradient
  copies into the offloaded fp32 buffers when ``overlap_comm``) and ``step`` (CPU Adam where the
  optimizer is offloaded, then the updated weights copied back);

and counts ZeRO-3's parameter fetches per step (sub-module fetches that gathered something, the
elements and bytes gathered) by wrapping DeepSpeed's ``PartitionedParameterCoordinator``. A second
part times the optimizer alone over the recipe's trained parameters (same shapes, fp32): DeepSpeed's
CPU Adam and torch's fused / foreach AdamW at each ``--adam-threads``, with the memory traffic each
step implies (fp32 weight, gradient and two moments read, weight and moments written: 28 bytes a
parameter) turned into GB/s.

    python tools/bench/deepspeed_budget.py [--recipe gpu_vit_s16] [--pages 2] [--steps 4] [--rounds 2]
        [--configs zero3_optimizer_offload.json zero2_optimizer_offload.json ...] [--adam-threads 1 2]
        [--out runs/deepspeed_budget.json]

On a CUDA machine the same script measures the GPU engines (``--device cuda``).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIGS = ["zero3_optimizer_offload.json", "zero3_resident_optimizer_offload.json",
                   "zero2_optimizer_offload.json", "zero3_param_offload.json"]
PHASES = ("forward", "backward", "optimizer", "ema")
BYTES_PER_PARAM = 28  # fp32 weight, grad, exp_avg, exp_avg_sq read (16) + weight, exp_avg, exp_avg_sq written (12)


def _overrides(args) -> list[str]:
    return [f"train.device={args.device}", f"train.precision={args.precision}", "train.compile=false",
            f"optim.batch_size={args.pages}", "data.num_workers=0", f"threads={args.threads}"]


def worker(args) -> dict:
    """One engine: ``--steps`` timed steps after one warm-up; phase seconds per step."""
    import time

    import torch

    from gsdistill.config import load_config
    from gsdistill.losses import validation
    from gsdistill.models.gsdistill_model import GSDistill
    from gsdistill.pretrain.data_stream import tensor_batch, to_device
    from gsdistill.pretrain.distributed import setup
    from gsdistill.pretrain.run import build_engine
    from gsdistill.threads import apply_threads

    engine_name = "torch" if args.worker == "torch" else "deepspeed"
    extra = [] if engine_name == "torch" else [f"train.deepspeed_config=configs/deepspeed/{args.worker}"]
    cfg = load_config("pretrain", args.recipe, _overrides(args) + [f"train.engine={engine_name}", *extra])
    apply_threads(args.threads)
    validation.set_checks(False)  # as the loop after its first step
    _, _, device = setup(engine_name, args.device)
    torch.manual_seed(0)
    model = GSDistill(cfg)
    trained = sum(p.numel() for _, p in model.student_parameters() if p.requires_grad)
    timers = _time_methods() if engine_name == "deepspeed" else None
    engine = build_engine(cfg, model, device, 1, args.pages)
    fetches = _count_fetches() if engine_name == "deepspeed" else None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for step in range(args.steps + 1):
        batch = to_device(tensor_batch(cfg, args.pages, seed=step), device)
        if fetches is not None:
            fetches.update(calls=0, gathers=0, elements=0, bytes=0)
            timers.update({k: 0.0 for k in timers})
        t, c = [time.perf_counter()], [time.process_time()]

        def mark():
            sync()
            t.append(time.perf_counter())
            c.append(time.process_time())
        terms = engine.forward(batch)
        mark()
        if engine_name == "torch":
            engine.optimizer.zero_grad(set_to_none=True)
            terms["total"].backward()
            mark()
            torch.nn.utils.clip_grad_norm_(engine.params, engine.clip)
            engine.optimizer.step()
        else:
            engine.engine.backward(terms["total"])
            mark()
            engine.engine.step()
        mark()
        engine.update_teacher(0.996)
        mark()
        if step == 0:
            continue  # warm-up: first calls allocate, DeepSpeed builds its buffers
        row = {}
        for i, phase in enumerate(PHASES):  # wall seconds, and the process's CPU seconds (robust to load)
            row[phase], row[f"{phase}_cpu"] = t[i + 1] - t[i], c[i + 1] - c[i]
        row["total"], row["total_cpu"] = t[-1] - t[0], c[-1] - c[0]
        if fetches is not None:
            row.update({f"fetch_{k}": v for k, v in fetches.items()})
            row.update(timers)
        rows.append(row)
    return {"engine": args.worker, "trained_params": trained, "threads": torch.get_num_threads(), "steps": rows}


# DeepSpeed methods whose host (thread CPU) time is summed per step: ZeRO-3's per-module parameter hooks,
# the per-parameter gradient hooks and end-of-backward copies of both stages, and the CPU Adam step
TIMED = {
    "deepspeed.runtime.zero.partitioned_param_coordinator:PartitionedParameterCoordinator":
        {"fetch_sub_module": "hook_fetch", "release_sub_module": "hook_release"},
    "deepspeed.runtime.zero.stage3:DeepSpeedZeroOptimizer_Stage3":
        {"reduce_ready_partitions_and_remove_grads": "grad_hooks", "independent_gradient_partition_epilogue": "grad_epilogue",
         "_optimizer_step": "adam"},
    "deepspeed.runtime.zero.stage_1_and_2:DeepSpeedZeroOptimizer":
        {"reduce_ready_partitions_and_remove_grads": "grad_hooks", "independent_gradient_partition_epilogue": "grad_epilogue",
         "_optimizer_step": "adam"},
}


def _time_methods() -> dict:
    """Wrap :data:`TIMED`: seconds of this thread's CPU inside each (outermost calls only)."""
    import importlib
    import time
    totals = {name: 0.0 for methods in TIMED.values() for name in methods.values()}
    depth = {"n": 0}

    def wrap(fn, name):
        def timed(*a, **k):
            depth["n"] += 1
            t0 = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                depth["n"] -= 1
                if depth["n"] == 0:
                    totals[name] += time.thread_time() - t0
        return timed
    for where, methods in TIMED.items():
        module, cls = where.split(":")
        klass = getattr(importlib.import_module(module), cls)
        for method, name in methods.items():
            setattr(klass, method, wrap(getattr(klass, method), name))
    return totals


def _count_fetches() -> dict:
    """Wrap ZeRO-3's sub-module fetch: per call, what was not on the device and had to be gathered."""
    from deepspeed.runtime.zero import partitioned_param_coordinator as ppc
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    counts = {"calls": 0, "gathers": 0, "elements": 0, "bytes": 0}
    original = ppc.PartitionedParameterCoordinator._fetch_sub_module_impl

    def counted(self, module, forward, is_leaf):
        missing = [p for p in ppc.iter_params(module, recurse=is_leaf) if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
        counts["calls"] += 1
        if missing:
            counts["gathers"] += 1
            counts["elements"] += sum(p.ds_numel for p in missing)
            counts["bytes"] += sum(p.ds_numel * p.element_size() for p in missing)
        return original(self, module, forward, is_leaf)
    ppc.PartitionedParameterCoordinator._fetch_sub_module_impl = counted
    return counts


def adam_worker(args) -> dict:
    """The optimizer alone over the recipe's trained parameter shapes: seconds per step."""
    import time

    import torch

    from gsdistill.config import load_config
    from gsdistill.models.gsdistill_model import GSDistill
    torch.set_num_threads(args.threads)
    cfg = load_config("pretrain", args.recipe, _overrides(args))
    shapes = [p.shape for _, p in GSDistill(cfg).student_parameters() if p.requires_grad]
    out = {"threads": args.threads, "params": sum(torch.Size(s).numel() for s in shapes)}
    for name in ("deepspeed_cpu_adam", "torch_fused", "torch_foreach"):
        params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        if name == "deepspeed_cpu_adam":
            from deepspeed.ops.adam import DeepSpeedCPUAdam
            opt = DeepSpeedCPUAdam(params, lr=1e-4, adamw_mode=True)
        else:
            opt = torch.optim.AdamW(params, lr=1e-4, fused=name == "torch_fused", foreach=name == "torch_foreach")
        times = []
        for i in range(args.steps + 1):
            t0 = time.perf_counter()
            opt.step()
            if i:
                times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        out[name] = {"median_s": med, "min_s": min(times), "gb_per_s": out["params"] * BYTES_PER_PARAM / med / 1e9}
        del params, opt
    return out


def _spawn(args, flag: str, value) -> dict:
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), NO_ALBUMENTATIONS_UPDATE="1", PYTHONPATH=str(REPO))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    cmd = [sys.executable, __file__, flag, str(value), "--recipe", args.recipe, "--pages", str(args.pages),
           "--steps", str(args.steps), "--device", args.device, "--precision", args.precision,
           "--threads", str(args.threads if flag == "--worker" else value)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{flag} {value} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ratio_interval(a: list[float], b: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % bootstrap interval of median(a) / median(b), the steps of each resampled on their own."""
    import numpy as np
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a), np.asarray(b)
    r = [np.median(rng.choice(a, a.size)) / np.median(rng.choice(b, b.size)) for _ in range(n)]
    return float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def summarize(runs: dict[str, list[dict]]) -> list[dict]:
    """Per engine: median phase seconds over every timed step of every round, and the ratio to torch
    (process CPU seconds, and wall) with its bootstrap interval."""
    table = []
    torch_total = statistics.median(r["total"] for r in runs["torch"])
    torch_cpu = [r["total_cpu"] for r in runs["torch"]]
    for name, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        med["ratio_to_torch"] = med["total"] / torch_total
        med["cpu_ratio_to_torch"] = med["total_cpu"] / statistics.median(torch_cpu)
        med["cpu_ratio_low"], med["cpu_ratio_high"] = ratio_interval([r["total_cpu"] for r in rows], torch_cpu)
        med["steps"], med["engine"] = len(rows), name
        table.append(med)
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="gpu_vit_s16")
    ap.add_argument("--pages", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    ap.add_argument("--adam-threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of each engine's worker (1: its CPU seconds are its work, robust to load)")
    ap.add_argument("--out", default="runs/deepspeed_budget.json")
    ap.add_argument("--report", metavar="JSON", help="print the tables of an earlier run's --out file, run nothing")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--adam", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.adam:
        print(json.dumps(adam_worker(args)))
        return 0
    if args.report:
        result = json.loads(Path(args.report).read_text())
        result["engines"] = summarize(result["raw"])
        print_tables(result)
        return 0
    runs: dict[str, list[dict]] = {}
    meta = {}
    for r in range(args.rounds):
        for name in ["torch", *args.configs]:
            got = _spawn(args, "--worker", name)
            runs.setdefault(name, []).extend(got["steps"])
            meta["trained_params"] = got["trained_params"]
            print(f"[budget] round {r + 1}: {name}: {statistics.median(s['total'] for s in got['steps']):.3f} s/step",
                  flush=True)
    adam = [_spawn(args, "--adam", t) for t in args.adam_threads]
    result = {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "adam")}, **meta,
              "engines": summarize(runs), "adam": adam, "raw": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print_tables(result)
    return 0


def print_tables(result: dict) -> None:
    cols = [*(f"{p}_cpu" for p in PHASES), "total_cpu", "cpu_ratio_to_torch", "cpu_ratio_low", "cpu_ratio_high",
            "steps", "total", "ratio_to_torch",
            "fetch_calls", "fetch_gathers", "fetch_bytes", *sorted({n for m in TIMED.values() for n in m.values()})]
    print("| engine | " + " | ".join(cols) + " |")
    for row in result["engines"]:
        print(f"| {row['engine']} | " + " | ".join(f"{row.get(c, float('nan')):.3g}" for c in cols) + " |")
    for a in result["adam"]:
        print(f"adam, {a['threads']} thread(s), {a['params'] / 1e6:.1f} M params: " + ", ".join(
            f"{k} {v['median_s'] * 1e3:.0f} ms ({v['gb_per_s']:.1f} GB/s)" for k, v in a.items() if isinstance(v, dict)))


if __name__ == "__main__":
    sys.exit(main())
