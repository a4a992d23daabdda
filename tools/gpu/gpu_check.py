"""The python core of ``tools/gpu_check.sh``: the GPU path of the paper's recipe, checked and timed
in one lease (target: <= 8 minutes on one GPU, its own data included).

On a machine with GPUs, in this order, each part's seconds printed as it ends and tabled at the end:
the synthetic pages (built on every core, ``prepare_synthetic``); the tests marked ``cuda``
(``pytest -m cuda``); DeepSpeed's CPU Adam, built once (a JIT compile); a short ViT-S/16 bf16 run
of each engine at the recipe's batch (``gpu_vit_s16``; on 2 GPUs too when there are 2): step time,
pages/s, the median wait for data, peak memory, model FLOP/s as a share of the GPU's bf16 peak, the
container's CPU quota and throttled time, and the torch run's loop profiled (``train.profile_steps``:
its phases, data loading and the wait for the device included, against the bare engine's profile);
the agreement check: both engines in bf16 on the GPU and the torch engine in fp32 on the CPU, 3
steps of the same recipe at a batch the CPU finishes in well under a minute (its point is the
terms' agreement, not the batch); a ``torch.profiler`` row (top kernels and their share of the
GPU time); one epoch of head-only detection on the torch run's backbone. Then a markdown table
(``gpu_check.md``). ``--no-tests``: skip the tests (a lease that runs them in a call of their own).

``--cpu``: the same commands at tiny sizes on the CPU (bf16 there is CPU autocast / DeepSpeed's
CPU accelerator), so that CI keeps the script working where no GPU is.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TERMS = ("total", "sem", "geom", "distill", "ibot", "koleo")
QUIET = ["train.log_every=1", "train.progress=false", "train.tensorboard=false", "train.plots=false",
         "train.ckpt_every=1000000"]  # one checkpoint, at the end
TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "data.page_width=256", "data.page_height=320", "data.shuffle_buffer=4", "data.num_workers=0"]
DEFAULT_DS = "zero2_optimizer_offload.json"  # train.deepspeed_config's default
AGREE_BATCH, AGREE_STEPS = 4, 3  # the agreement runs: ViT-S/16 on 4 pages, ~1 TFLOP a step, seconds on 16 cores
# dense bf16 tensor-core peaks (no sparsity), FLOP/s, by a part of the device name
BF16_PEAK = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
             "A10": 125e12, "RTX 4090": 165e12}


class Parts:
    """Seconds of each part of the check, printed as each ends."""

    def __init__(self, on_end=None):
        self.seconds: dict[str, float] = {}
        self.on_end = on_end  # called after each part: the report so far is written, so a lease cut short keeps it

    def run(self, name: str, fn, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[name] = time.perf_counter() - start
            print(f"[gpu_check] {name}: {self.seconds[name]:.1f} s", flush=True)
            if self.on_end is not None:
                self.on_end()

    def table(self) -> list[str]:
        rows = [f"| {name} | {s:.1f} |" for name, s in self.seconds.items()]
        return ["| part | seconds |", "|---|---|", *rows, f"| all | {sum(self.seconds.values()):.1f} |"]


def sizes(cpu: bool, steps: int) -> tuple[list[str], int]:
    """(config overrides, global batch): tiny on the CPU, the GPU recipe at a short length otherwise."""
    if cpu:
        return [*TINY, "optim.batch_size=4", f"optim.steps={steps}", "optim.warmup_steps=1"], 4
    return [f"optim.steps={steps}", "optim.batch_size=64", "optim.warmup_steps=5", "data.num_workers=8"], 64


def bf16_peak(cpu: bool) -> tuple[float, str]:
    """(FLOP/s, where it comes from): the spec sheet for a known GPU, else a bf16 matmul measured here."""
    if not cpu:
        name = torch.cuda.get_device_name(0)
        for part, peak in BF16_PEAK.items():
            if part in name:
                return peak, f"{name} spec"
    device, n = ("cpu", 1024) if cpu else ("cuda", 8192)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    (a @ a).sum().item()
    start, reps = time.perf_counter(), 5
    for _ in range(reps):
        b = a @ a
    b.sum().item()
    return 2 * n**3 * reps / (time.perf_counter() - start), f"bf16 matmul measured on {device}"


def flops_per_page(experiment: str | None, overrides: list[str]) -> float:
    """Model FLOPs of one training step (forward + backward), per page, counted on 2 pages on the CPU
    with the average iBOT masking (``tensor_batch(mean_masks=True)``: the expected FLOPs of a step;
    a 2-page draw masks anywhere from 0 to all of its global views, each share of the peak with it)."""
    from torch.utils.flop_counter import FlopCounterMode

    from gsdistill.config import load_config
    from gsdistill.models.gsdistill_model import GSDistill
    from gsdistill.pretrain.data_stream import tensor_batch

    cfg = load_config("pretrain", experiment, overrides)
    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    batch = tensor_batch(cfg, 2, patch_size=int(model.backbone.patch_embed.patch_size[0]), mean_masks=True)
    with FlopCounterMode(display=False) as counter:
        model(batch)["total"].backward()
    return counter.get_total_flops() / 2


def launch(prefix: list[str], experiment: str | None, overrides: list[str], run_dir: Path, log: Path,
           timeout: float | None = None) -> dict:
    """One ``gsdistill pretrain`` under ``prefix`` (python -m, torchrun, deepspeed); its metrics (rc
    ``"timeout"`` when it outlived ``timeout`` seconds: what it logged so far is kept)."""
    from gsdistill.pretrain.metrics_log import read_metrics

    cmd = [*prefix, "gsdistill.cli", "pretrain", *([experiment] if experiment else []), "--run-dir", str(run_dir),
           *overrides, *QUIET]
    with open(log, "w") as out:
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    rows = read_metrics(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else []
    return {"rc": rc, "rows": rows, "log": log}


def cpu_limits() -> dict:
    """This machine's CPU quota and throttled time so far (cgroup v2 ``cpu.max`` / ``cpu.stat``, else
    v1 ``cpu.cfs_*``): a container whose quota is below its core count stalls every thread of the
    loop at once, the main thread's kernel launches too. Empty where neither is readable."""
    v2, v1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")
    try:
        if (v2 / "cpu.max").is_file():
            quota, period = (v2 / "cpu.max").read_text().split()
            stat = dict(line.split() for line in (v2 / "cpu.stat").read_text().splitlines())
            return {"cpus": None if quota == "max" else int(quota) / int(period),
                    "throttled_ms": int(stat.get("throttled_usec", 0)) / 1e3}
        if (v1 / "cpu.cfs_quota_us").is_file():
            quota, period = (int((v1 / f).read_text()) for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
            stat = dict(line.split() for line in (v1 / "cpu.stat").read_text().splitlines())
            return {"cpus": None if quota < 0 else quota / period, "throttled_ms": int(stat.get("throttled_time", 0)) / 1e6}
    except (OSError, ValueError):
        pass
    return {}


def build_deepspeed_ops() -> str:
    """Build (or find cached) DeepSpeed's CPU Adam, so that no run's step time holds the compile."""
    code = "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    return "built" if done.returncode == 0 else f"FAILED: {(done.stderr.strip().splitlines() or ['?'])[-1]}"


# the torch run's loop is profiled (train.profile_steps): steps 3 (the profiler's warm-up) to 6, left out of its medians
PROFILE_STEPS = 3
PROFILED = range(3, 4 + PROFILE_STEPS)


def _median(rows: list[dict], key: str) -> float:
    timed = [float(r[key]) for r in rows[1:] if int(float(r["step"])) not in PROFILED]  # step 1 warms up
    return statistics.median(timed or [float(r[key]) for r in rows[1:]] or [float(rows[0][key])])


def loop_profile(run_dir: Path, top: int = 12) -> list[str]:
    """The head of the torch run's loop profile (``train.profile_steps``): where the loop's main thread
    and the device spend a step, data loading included, to set against the bare engine's profile row."""
    report = run_dir / "profile" / "top_ops.txt"
    if not report.is_file():
        return [f"Loop profile: none written ({report} missing)."]
    blocks = report.read_text().strip().split("\n\n")
    lines = [f"Loop profile of the torch run ({report.relative_to(run_dir.parent)}; `trace.json` beside it): "
             f"{blocks[0]}", ""]
    for i, block in enumerate(blocks[1:]):
        title, *rows = block.splitlines()
        lines += [title, "", "```", *(rows if i == 0 else rows[:top]), "```", ""]  # every phase; the top operators
    return lines


def run_table(runs: dict, batch: int, flops: float, peak: float) -> list[str]:
    head = ["run", "exit", "step 1 s", "step s (median)", "pages/s", "data wait ms (median)", "peak mem GiB", "model TFLOP/s",
            "share of bf16 peak"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, run in runs.items():
        rows = run["rows"]
        if run["rc"] != 0 or not rows:
            lines.append(f"| {name} | {run['rc']} | failed: see {run['log']} |" + " |" * (len(head) - 3))
            continue
        step_s = _median(rows, "step_s")
        mem = max(float(r.get("peak_mem_gb", "nan")) for r in rows)
        lines.append(f"| {name} | 0 | {float(rows[0]['step_s']):.1f} | {step_s:.3f} | {batch / step_s:.1f} | {1e3 * _median(rows, 'data_s'):.1f} "
                     f"| {mem:.2f} | {flops * batch / step_s / 1e12:.3f} | {flops * batch / step_s / peak:.1%} |")
    return lines


def agreement_table(runs: dict, ref: dict, steps: int) -> list[str]:
    """Each bf16 run's terms at every step against the CPU fp32 reference: the largest relative difference."""
    ref_rows = {int(float(r["step"])): r for r in ref["rows"]}
    head = ["run", "exit", *[f"step {s}: max rel. diff of the terms" for s in range(1, steps + 1)]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    if ref["rc"] != 0 or not ref_rows:
        return [*lines, f"| CPU fp32 reference | {ref['rc']} | failed: see {ref['log']} |" + " |" * (steps - 1)]
    for name, run in runs.items():
        rows = {int(float(r["step"])): r for r in run["rows"]}
        cells = [f"{max(_rel(rows[s][t], ref_rows[s][t]) for t in TERMS if t in rows[s]):.2g}"
                 if s in rows and s in ref_rows else "n/a" for s in range(1, steps + 1)]
        lines.append(f"| {name} | {run['rc']} | " + " | ".join(cells) + " |")
    return lines


def _rel(a, b) -> float:
    a, b = float(a), float(b)
    return abs(a - b) / max(abs(b), 1e-12)


def detection_epoch(cpu: bool, backbone: Path, out: Path) -> str:
    """One epoch of head-only detection on synthetic pages with the run's backbone; a table row."""
    from gsdistill.detect.convert import pages_to_yolo
    from gsdistill.tuples.sources.synthetic import generate_pages

    pages, size = (8, 64) if cpu else (256, 640)
    data = pages_to_yolo(generate_pages(pages, seed=3, width=200 if cpu else 612, height=256 if cpu else 792),
                         out / "detect_data", val_fraction=0.25)
    args = ["--config", "cpu_smoke"] if cpu else []
    cmd = [sys.executable, "-m", "gsdistill.cli", "detect", "train", *args, f"data={data}", f"backbone={backbone}",
           "epochs=1", f"imgsz={size}", f"project={out / 'detect'}", "name=head_only",
           f"device={'cpu' if cpu else 'cuda'}"]
    with open(out / "detect.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
    return f"Detection, head only, 1 epoch ({pages} pages, {size} px): exit {rc}."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (CI)")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed run (default: 3 with --cpu, 20 on GPUs)")
    ap.add_argument("--out", default="runs/gpu_check", help="folder for the runs, logs and gpu_check.md")
    ap.add_argument("--deepspeed-configs", nargs="+", default=[DEFAULT_DS], metavar="JSON",
                    help=f"configs/deepspeed/ files timed in one process (default: {DEFAULT_DS})")
    ap.add_argument("--compile", action="store_true",
                    help="also time the torch engine with train.compile=true (its first step compiles: ~2 min on an "
                         "H100; the runs here are too short for train.compile=auto to compile)")
    ap.add_argument("--no-tests", action="store_true",
                    help="skip the tests marked cuda (a lease that runs them in a call of their own)")
    args = ap.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        from gsdistill.device import cuda_unusable_reason
        print(f"gpu_check: no usable GPU ({cuda_unusable_reason()}); run with --cpu for the CPU check", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (3 if args.cpu else 20)
    experiment = None if args.cpu else "gpu_vit_s16"
    overrides, batch = sizes(args.cpu, steps)
    gpus = 0 if args.cpu else torch.cuda.device_count()
    device = "cpu" if args.cpu else "cuda"
    parts = Parts(on_end=lambda: (out / "gpu_check.md").write_text(
        "\n".join([*lines, "Seconds per part (so far):", "", *parts.table()]) + "\n"))
    lines = [f"# gsdistill GPU check ({'--cpu' if args.cpu else f'{gpus} x ' + torch.cuda.get_device_name(0)})", "",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}, {time.strftime('%Y-%m-%d %H:%M')}, "
             f"{steps} steps, global batch {batch}", ""]

    from gsdistill.config import load_config
    from gsdistill.pretrain.run import prepare_synthetic
    pages = 10 if args.cpu else 8 * batch * max(1, gpus)  # every worker of every rank: whole batches
    data = parts.run("data: synthetic pages, built and embedded", prepare_synthetic,
                     load_config("pretrain", experiment, [*overrides, f"data.synthetic_pages={pages}"]), out / "data")
    if not args.cpu and not args.no_tests:
        # only the files that hold cuda tests: collecting the others imports packages a GPU image may
        # lack (pymupdf, faiss, ...), and each such file was a collection error (24 in one lease)
        files = sorted(str(f.relative_to(REPO)) for f in (REPO / "tests").glob("test_*.py")
                       if "mark.cuda" in f.read_text())
        pytest = [sys.executable, "-m", "pytest", "-q", "-rfE", "-m", "cuda", *files]
        tests = parts.run("tests marked cuda", subprocess.run, pytest, cwd=REPO, capture_output=True, text=True)
        (out / "tests_cuda.log").write_text(tests.stdout + tests.stderr)
        lines += [f"CUDA tests (`pytest -m cuda` in {len(files)} files; log tests_cuda.log): "
                  f"{(tests.stdout.strip().splitlines() or ['no output'])[-1]}", ""]
    ops = parts.run("DeepSpeed CPU Adam build", build_deepspeed_ops)
    lines += [f"DeepSpeed CPU Adam: {ops}.", ""]

    common = [*overrides, f"data.shards={data}"]
    python = [sys.executable, "-m"]
    plan = {"torch bf16, 1 process": (python, ["train.engine=torch", f"train.profile_steps={PROFILE_STEPS}"])}
    if args.compile:
        plan["torch bf16 compiled, 1 process"] = (python, ["train.engine=torch", "train.compile=true"])
    for name in args.deepspeed_configs:
        plan[f"deepspeed bf16 ({name}), 1 process"] = (python, ["train.engine=deepspeed",
                                                                f"train.deepspeed_config=configs/deepspeed/{name}"])
    if gpus >= 2:
        plan["torch bf16, 2 GPUs (torchrun)"] = ([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m"],
                                                 ["train.engine=torch"])
        plan["deepspeed bf16, 2 GPUs"] = ([str(BIN / "deepspeed"), "--num_gpus", "2", "--module"],
                                          ["train.engine=deepspeed"])
    limits = cpu_limits()
    runs = {name: parts.run(f"run: {name}", launch, prefix, experiment,
                            [*common, *extra, f"train.device={device}", "train.precision=bf16"], out / f"run{i}",
                            out / f"run{i}.log")
            for i, (name, (prefix, extra)) in enumerate(plan.items())}
    after = cpu_limits()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines += [f"CPU: {cores} cores for this process; cgroup quota "
              + (("none" if limits["cpus"] is None else f"{limits['cpus']:g} CPUs")
                 + f", throttled {after['throttled_ms'] - limits['throttled_ms']:.0f} ms during the runs"
                 if limits and after else "not readable") + ".", ""]

    agree = [*common, f"optim.batch_size={AGREE_BATCH}", f"optim.steps={AGREE_STEPS}", "data.num_workers=0"]
    agreed = {f"{engine} bf16 on {device}": parts.run(f"agreement: {engine} bf16", launch, python, experiment,
                                                      [*agree, f"train.engine={engine}", f"train.device={device}",
                                                       "train.precision=bf16"], out / f"agree_{engine}",
                                                      out / f"agree_{engine}.log")
              for engine in ("torch", "deepspeed")}
    ref = parts.run("agreement: CPU fp32 reference", launch, python, experiment,
                    [*agree, "train.engine=torch", "train.device=cpu", "train.precision=fp32"], out / "cpu_fp32",
                    out / "cpu_fp32.log")

    peak, peak_source = bf16_peak(args.cpu)
    flops = parts.run("FLOP count", flops_per_page, experiment, overrides)
    lines += [f"Model FLOPs per page and step (forward + backward, counted with the average iBOT masking): "
              f"{flops / 1e9:.2f} GFLOP; "
              f"bf16 peak {peak / 1e12:.1f} TFLOP/s ({peak_source}).", ""]
    lines += [*run_table(runs, batch, flops, peak), "", *loop_profile(out / "run0")]
    lines += [f"Agreement: {AGREE_STEPS} steps of {AGREE_BATCH} pages (the same batches, `data.num_workers=0`), "
              "bf16 against the torch engine in fp32 on the CPU:", "", *agreement_table(agreed, ref, AGREE_STEPS), ""]
    from gpu_profile import profile_row, profile_steps  # this file's folder is on sys.path when it runs
    profiled = parts.run("profile", profile_steps, experiment, overrides, batch, torch.device(device))
    lines += [profile_row(profiled), ""]
    first = runs["torch bf16, 1 process"]
    if first["rc"] == 0:
        lines += [parts.run("detection epoch", detection_epoch, args.cpu, out / "run0" / "backbone", out), ""]
    lines += ["Seconds per part:", "", *parts.table()]
    report = "\n".join(lines) + "\n"
    (out / "gpu_check.md").write_text(report)
    print(report)
    failed = [n for n, r in {**runs, **agreed, "cpu fp32 reference": ref}.items() if r["rc"] != 0]
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)} (logs in {out})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    sys.exit(main())
