"""One CPU-thread setting for every stage, so that two jobs on one machine do not over-subscribe it.

Each stage's config has ``threads`` (``null`` = automatic). The automatic count is the cores this
process may use (``os.sched_getaffinity``, which ``taskset`` and container CPU sets restrict)
divided among the processes that share them: the ranks of this machine (``LOCAL_WORLD_SIZE``, set by
torchrun / deepspeed) and, per rank, the main process plus its DataLoader workers. Each stage's CLI
calls :func:`apply_threads` once, before any torch work.
"""
from __future__ import annotations

import os
import sys


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS / Windows
        return os.cpu_count() or 1


def default_threads(workers: int = 0) -> int:
    """``available_cores() // (ranks on this machine * (1 + DataLoader workers))``, at least 1."""
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, available_cores() // (ranks * (1 + max(0, int(workers)))))


def apply_threads(threads: int | None, workers: int = 0, ultralytics: bool = False, torch_too: bool = True) -> int:
    """Set torch's intra-op threads to ``threads`` (None: :func:`default_threads`) and return the count.

    ``OMP_NUM_THREADS`` is set too, for processes this one starts. ``ultralytics``: also pin the
    count Ultralytics' ``select_device`` resets torch to on CPU (its own ``min(8, cores - 1)``).
    ``torch_too`` False: a stage that needs no torch (``tuples build``) does not import it (~1 s of
    start-up, serial before any worker starts); torch imported later reads ``OMP_NUM_THREADS``.
    """
    n = int(threads) if threads else default_threads(workers)
    os.environ["OMP_NUM_THREADS"] = str(n)
    if torch_too or "torch" in sys.modules:
        import torch
        torch.set_num_threads(n)
    if ultralytics:
        from ultralytics.utils import torch_utils
        torch_utils.NUM_THREADS = n
    return n


def limit_worker_threads(threads: int, _worker_id: int | None = None) -> None:
    """A DataLoader worker's ``worker_init_fn``: torch AND OpenCV to ``threads`` each.

    torch already runs one thread in a worker, but OpenCV (albumentations' resizes in the views
    pipeline) starts a pool as large as the machine in every worker: 8 workers on 16 cores ran ~130
    threads beside the main process, whose kernel launches then waited for a core (the training
    loop's step on an H100 took about twice the bare engine step). Bound with ``functools.partial``.
    """
    import torch
    torch.set_num_threads(threads)
    try:
        import cv2
    except ImportError:  # no OpenCV in this environment: nothing of it to limit
        return
    cv2.setNumThreads(threads)
