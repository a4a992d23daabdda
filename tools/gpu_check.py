"""The python core of ``tools/gpu_check.sh``: the GPU path of the paper's recipe, checked and timed.

On a machine with GPUs: the CUDA tests (``pytest -k cuda``), a short ViT-S/16 run of each engine
in bf16 (``gpu_vit_s16``; on 2 GPUs too when there are 2, through ``torchrun`` and ``deepspeed``),
one epoch of head-only detection on the torch run's backbone, and a markdown table: step time,
images (pages) per second, peak memory, model FLOP/s as a share of the GPU's bf16 peak, and the
loss terms after the first steps against the same steps run on the CPU in fp32.

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

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TERMS = ("total", "sem", "geom", "distill", "ibot", "koleo")
QUIET = ["train.log_every=1", "train.progress=false", "train.tensorboard=false", "train.plots=false",
         "train.ckpt_every=1000000"]  # one checkpoint, at the end
TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "data.page_width=256", "data.page_height=320", "data.shuffle_buffer=4", "data.num_workers=0"]
# dense bf16 tensor-core peaks (no sparsity), FLOP/s, by a part of the device name
BF16_PEAK = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
             "A10": 125e12, "RTX 4090": 165e12}


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
    """Model FLOPs of one training step (forward + backward), per page, counted on 2 pages on the CPU."""
    from torch.utils.flop_counter import FlopCounterMode

    from gsdistill.config import load_config
    from gsdistill.models.gsdistill_model import GSDistill
    from gsdistill.pretrain.data_stream import tensor_batch

    cfg = load_config("pretrain", experiment, overrides)
    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    batch = tensor_batch(cfg, 2, patch_size=int(model.backbone.patch_embed.patch_size[0]))
    with FlopCounterMode(display=False) as counter:
        model(batch)["total"].backward()
    return counter.get_total_flops() / 2


def launch(prefix: list[str], experiment: str | None, overrides: list[str], run_dir: Path, log: Path) -> dict:
    """One ``gsdistill pretrain`` under ``prefix`` (python -m, torchrun, deepspeed); its metrics."""
    from gsdistill.pretrain.metrics_log import read_metrics

    cmd = [*prefix, "gsdistill.cli", "pretrain", *([experiment] if experiment else []), "--run-dir", str(run_dir),
           *overrides, *QUIET]
    start = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    rows = read_metrics(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else []
    return {"rc": done.returncode, "rows": rows, "wall_s": time.perf_counter() - start, "log": log}


def run_table(runs: dict, ref: dict, batch: int, flops: float, peak: float, compare_step: int) -> list[str]:
    head = ["run", "exit", "step s (median)", "images/s", "peak mem GiB", "model TFLOP/s", "share of bf16 peak",
            f"terms at step {compare_step} vs CPU fp32 (max rel. diff)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ref_row = next((r for r in ref["rows"] if int(float(r["step"])) == compare_step), None)
    for name, run in runs.items():
        rows = run["rows"]
        if run["rc"] != 0 or not rows:
            lines.append(f"| {name} | {run['rc']} | failed: see {run['log']} |" + " |" * (len(head) - 3))
            continue
        timed = [float(r["step_s"]) for r in rows[1:]] or [float(rows[0]["step_s"])]  # step 1 warms up
        step_s = statistics.median(timed)
        row = next((r for r in rows if int(float(r["step"])) == compare_step), None)
        diff = "n/a" if row is None or ref_row is None else f"{max(_rel(row[t], ref_row[t]) for t in TERMS if t in row):.2g}"
        mem = max(float(r.get("peak_mem_gb", "nan")) for r in rows)
        lines.append(f"| {name} | 0 | {step_s:.3f} | {batch / step_s:.1f} | {mem:.2f} | {flops * batch / step_s / 1e12:.3f} "
                     f"| {flops * batch / step_s / peak:.1%} | {diff} |")
    return lines


def _rel(a, b) -> float:
    a, b = float(a), float(b)
    return abs(a - b) / max(abs(b), 1e-12)


def detection_epoch(cpu: bool, backbone: Path, out: Path) -> str:
    """One epoch of head-only detection on synthetic pages with the run's backbone; a table row."""
    from gsdistill.detect.convert import pages_to_yolo
    from gsdistill.tuples.synthetic import generate_pages

    pages, size = (8, 64) if cpu else (256, 640)
    data = pages_to_yolo(generate_pages(pages, seed=3, width=200 if cpu else 612, height=256 if cpu else 792),
                         out / "detect_data", val_fraction=0.25)
    args = ["--config", "cpu_smoke"] if cpu else []
    cmd = [sys.executable, "-m", "gsdistill.cli", "detect", "train", *args, f"data={data}", f"backbone={backbone}",
           "epochs=1", f"imgsz={size}", f"project={out / 'detect'}", "name=head_only",
           f"device={'cpu' if cpu else 'cuda'}"]
    start = time.perf_counter()
    with open(out / "detect.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
    return f"| detection, head only, 1 epoch ({pages} pages, {size} px) | {rc} | {time.perf_counter() - start:.1f} s wall |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (CI)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: 3 with --cpu, 20 on GPUs)")
    ap.add_argument("--out", default="runs/gpu_check", help="folder for the runs, logs and gpu_check.md")
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
    lines = [f"# gsdistill GPU check ({'--cpu' if args.cpu else f'{gpus} x ' + torch.cuda.get_device_name(0)})", "",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}, {time.strftime('%Y-%m-%d %H:%M')}, "
             f"{steps} steps, global batch {batch}", ""]
    if not args.cpu:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-k", "cuda", "tests"], cwd=REPO,
                               capture_output=True, text=True)
        lines += [f"CUDA tests (`pytest -k cuda`): {(tests.stdout.strip().splitlines() or ['no output'])[-1]}", ""]

    from gsdistill.config import load_config
    from gsdistill.pretrain.run import prepare_synthetic
    pages = 10 if args.cpu else max(2048, 8 * batch * max(1, gpus))  # every worker of every rank: whole batches
    data = prepare_synthetic(load_config("pretrain", experiment, [*overrides, f"data.synthetic_pages={pages}"]),
                             out / "data")  # once, shared by every run: the same pages everywhere
    common = [*overrides, f"data.shards={data}"]
    device = "cpu" if args.cpu else "cuda"
    python = [sys.executable, "-m"]
    plan = {"torch bf16, 1 process": (python, ["train.engine=torch"]),
            "deepspeed bf16, 1 process": (python, ["train.engine=deepspeed"])}
    if gpus >= 2:
        plan["torch bf16, 2 GPUs (torchrun)"] = ([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m"],
                                                 ["train.engine=torch"])
        plan["deepspeed bf16, 2 GPUs"] = ([str(BIN / "deepspeed"), "--num_gpus", "2", "--module"],
                                          ["train.engine=deepspeed"])
    runs = {}
    for i, (name, (prefix, extra)) in enumerate(plan.items()):
        runs[name] = launch(prefix, experiment, [*common, *extra, f"train.device={device}", "train.precision=bf16"],
                            out / f"run{i}", out / f"run{i}.log")
    compare = min(3, steps)
    ref = launch(python, experiment, [*common, "train.engine=torch", "train.device=cpu", "train.precision=fp32",
                                      f"optim.steps={steps}", f"train.stop_after={compare}"], out / "cpu_fp32",
                 out / "cpu_fp32.log")
    peak, peak_source = bf16_peak(args.cpu)
    flops = flops_per_page(experiment, overrides)
    lines += [f"Model FLOPs per page and step (forward + backward, counted): {flops / 1e9:.2f} GFLOP; "
              f"bf16 peak {peak / 1e12:.1f} TFLOP/s ({peak_source}).", ""]
    lines += run_table(runs, ref, batch, flops, peak, compare)
    first = runs["torch bf16, 1 process"]
    if first["rc"] == 0:
        lines.append(detection_epoch(args.cpu, out / "run0" / "backbone", out))
    report = "\n".join(lines) + "\n"
    (out / "gpu_check.md").write_text(report)
    print(report)
    failed = [n for n, r in runs.items() if r["rc"] != 0] + (["cpu fp32 reference"] if ref["rc"] != 0 else [])
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)} (logs in {out})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    sys.exit(main())
