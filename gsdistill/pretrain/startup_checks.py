"""Checks ``gsdistill pretrain`` makes before it builds anything, each failing with one line that names
the config key: the batch splits over the ranks, every DataLoader reader gets a whole batch, and
the device can run the precision. :func:`describe` is the line printed at start.

Pages: each DataLoader worker of each rank reads its own part of the pages and makes its own
complete batches (``drop_last`` applies per worker), so an epoch needs at least
``ranks x readers per rank x local batch`` pages (``readers = max(1, data.num_workers)``), that is
``readers x optim.batch_size``. With fewer, a reader makes no batch and the run would stop at its
first step, or (the old way) a worker would wait forever.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gsdistill.errors import InputError


def check_batch_split(cfg, world: int) -> int:
    """This rank's batch (``optim.batch_size / world``)."""
    global_batch = int(cfg["optim"]["batch_size"])
    if global_batch % world:
        raise InputError(f"optim.batch_size={global_batch} does not split over {world} processes")
    return global_batch // world


def page_count(cfg, shards: str | None = None) -> tuple[int, str] | None:
    """Pages the run will read (of ``shards``, else of the config's data) and the key that sets
    them; None when the shard dir has no manifest yet (its own error comes when data are prepared)."""
    d = cfg["data"]
    shards = shards or d["shards"]
    if not shards:
        return int(d["synthetic_pages"]), f"data.synthetic_pages={int(d['synthetic_pages'])}"
    from gsdistill.tuples.store.reader import read_manifest

    if not (Path(shards) / "manifest.json").is_file():
        return None
    pages = sum(int(s["pages"]) for s in read_manifest(shards)["shards"])
    key = "data.shards" if d["shards"] else "data.synthetic_pages"
    return pages, f"{key}: {shards} ({pages} pages)"


def check_pages(cfg, world: int, pages: int, source: str) -> None:
    """Every DataLoader reader of every rank gets at least one whole batch an epoch."""
    local = check_batch_split(cfg, world)
    workers = int(cfg["data"]["num_workers"])
    readers = world * max(1, workers)
    if pages // readers >= local:
        return
    need = readers * local
    raise InputError(
        f"{source}: too few pages for {world} rank(s) x {max(1, workers)} DataLoader reader(s) per rank "
        f"(data.num_workers={workers}) x {local} pages per batch (optim.batch_size={cfg['optim']['batch_size']} "
        f"over {world} rank(s)): each worker makes its own whole batches, so an epoch needs {need} pages; "
        "lower data.num_workers or optim.batch_size, or give more pages")


def check_precision(cfg, device: torch.device) -> None:
    """bf16 only where the device computes it (CUDA: Ampere or newer; the CPU emulates it, slowly)."""
    precision = str(cfg["train"]["precision"])
    if precision not in ("fp32", "bf16"):
        raise InputError(f"train.precision must be fp32 or bf16, got {precision!r}")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        raise InputError(f"train.precision=bf16: {name} (compute capability {major}.{minor}) has no bf16 "
                         "arithmetic (Ampere, 8.0, or newer needed); use train.precision=fp32")


def check_before_start(cfg, world: int) -> None:
    """The checks that need no device and no process group: run on every rank, before joining."""
    check_batch_split(cfg, world)
    found = page_count(cfg)
    if found is not None:
        check_pages(cfg, world, *found)


def describe(cfg, device: torch.device, world: int) -> str:
    """``device cuda:0 (NVIDIA H100 80GB HBM3), precision bf16, engine deepspeed, 8 process(es)``."""
    what = str(device)
    if device.type == "cuda":
        what += f" ({torch.cuda.get_device_name(device)})"
    t = cfg["train"]
    return (f"device {what}, precision {t['precision']}, engine {t['engine']}, {world} process(es), "
            f"batch {cfg['optim']['batch_size']} ({int(cfg['optim']['batch_size']) // world} per process), "
            f"data.num_workers {cfg['data']['num_workers']}")
