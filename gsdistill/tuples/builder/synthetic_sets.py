"""Synthetic page sets for training runs, built by the parallel page-tuple builder.

The same build as ``gsdistill tuples build --from synthetic N`` (:func:`gsdistill.tuples.builder.driver.build_shards`):
shards are built by a pool of single-threaded processes on every core this process may use
(measured: 1.64-1.67x one process's pages/s with 2 workers on 2 cores, docs/benchmarks.md; one
H200 host made 6.8 pages/s in one process, so 4,096 pages took 10 minutes). Page ``i`` of seed ``s`` depends only on ``(s, i)``, so the
pages are those of ``generate_pages`` for any number of workers or shards.

The shard count is a multiple of the readers that will stream them (ranks x DataLoader workers),
at least the build's workers (every core gets a shard to build), with at most
``MAX_PAGES_PER_SHARD`` pages each. Where that multiple divides the pages (4,096 pages for 8
readers) the shards are equal and each reader streams whole shards of its own; otherwise the
remainder makes extra, shorter shards (never fewer shards than readers).
"""
from __future__ import annotations

import math
from pathlib import Path

from gsdistill.threads import available_cores

MAX_PAGES_PER_SHARD = 256  # the tuples builder's default shard size


def shard_count(pages: int, readers: int, workers: int) -> int:
    """Shards for ``pages`` pages: a multiple of ``readers``, at least ``workers`` and
    ``pages / MAX_PAGES_PER_SHARD``, at most one page each."""
    want = max(workers, math.ceil(pages / MAX_PAGES_PER_SHARD), 1)
    return max(1, min(pages, readers * math.ceil(want / readers)))


def build_synthetic(pages: int, out_dir: str | Path, *, seed: int, width: int, height: int, text_scale: float = 1.0,
                    readers: int = 1, workers: int | None = None, progress: bool = True) -> dict:
    """Build ``pages`` synthetic pages into shards in ``out_dir`` on ``workers`` processes (None:
    the cores this process may use); returns the manifest."""
    from gsdistill.config import load_config
    from gsdistill.tuples.builder.driver import build_shards

    workers = workers or available_cores()
    per_shard = max(1, pages // shard_count(pages, max(1, readers), workers))  # rounded down: never fewer shards
    cfg = load_config("tuples", None, [
        f"synthetic.seed={seed}", f"synthetic.width={width}", f"synthetic.height={height}",
        f"synthetic.text_scale={text_scale}", f"build.pages_per_shard={per_shard}", f"build.workers={workers}",
        f"build.progress={str(progress).lower()}"])
    return build_shards("synthetic", str(pages), out_dir, cfg)
