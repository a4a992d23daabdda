"""Where build units run: this process, a process pool on this machine, or a Ray cluster.

Every engine takes the same unit jobs (``units.build_unit``) and yields their records in the
order they finish; the output does not depend on the engine or its size, since each unit writes
its own shard and the manifest is assembled from the records in unit order.

Ray (``pip install 'gsdistill[ray]'``) is the engine for several machines: it installs with pip
(no JVM, unlike Spark), ``ray.init()`` alone starts a local cluster, and a failed task is retried by
Ray itself (``max_retries``: a worker process or node that died; ``retry_exceptions``: an error such
as a flaky network filesystem). On a cluster every node needs gsdistill installed and the input
and output folders at the same path (a shared filesystem): units read their input and write their
shard there, and only the small records travel back to the driver.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Iterator

from omegaconf import DictConfig

from gsdistill.threads import available_cores
from gsdistill.tuples.builder.units import build_unit
from gsdistill.tuples.errors import DataError
from gsdistill.tuples.worker_guard import second_interrupt_kills_workers, single_threaded, start_pool_worker  # noqa: F401

ENGINES = ("local", "ray")


def build_unit_single_threaded(job: dict) -> dict:
    single_threaded()
    return build_unit(job)


def run_local(jobs: list[dict], workers: int) -> Iterator[dict]:
    """Units in this process (``workers`` 1) or in a pool of ``workers`` single-threaded processes."""
    if workers <= 1 or len(jobs) <= 1:
        yield from map(build_unit, jobs)
        return
    # fork where there is one: workers start at once with this process's imports and settings
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with second_interrupt_kills_workers("the build"), \
            ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context, initializer=start_pool_worker,
                                initargs=(os.getpid(),)) as pool:
        futures = [pool.submit(build_unit, job) for job in jobs]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:  # a failed unit (a full disk) or a stop: do not build the rest first
            for future in futures:
                future.cancel()


def import_ray():
    try:
        import ray
    except ImportError:
        raise DataError("build.engine=ray needs Ray: pip install 'gsdistill[ray]' (or pip install 'ray>=2.9')") from None
    return ray


def run_ray(jobs: list[dict], address: str | None, workers: int, max_retries: int, ray=None) -> Iterator[dict]:
    """Units as Ray tasks of one CPU each, on the cluster at ``address`` (None: an existing
    ``ray.init`` of this process, else a new local cluster of ``workers`` CPUs)."""
    ray = ray or import_ray()
    started = not ray.is_initialized()
    handlers = saved_signal_handlers()
    if started:
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=workers, include_dashboard=False)
    try:
        task = ray.remote(build_unit_single_threaded).options(num_cpus=1, max_retries=max_retries,
                                                               retry_exceptions=True)
        pending = [task.remote(job) for job in jobs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()
            restore_signal_handlers(handlers)


def saved_signal_handlers() -> dict:
    """SIGTERM / SIGINT handlers of this process: ``ray.init`` replaces them with its own and
    ``ray.shutdown`` leaves them, so a training run later in the same process would not see its
    own SIGTERM handling (checkpoint, then stop)."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread can set handlers
    return {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}


def restore_signal_handlers(handlers: dict) -> None:
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


def run_units(jobs: list[dict], build: DictConfig) -> Iterator[dict]:
    """Records of ``jobs`` built on ``build.engine`` with ``build.workers`` (null: the cores this
    process may use)."""
    workers = int(build.workers) if build.workers else available_cores()
    if build.engine == "local":
        return run_local(jobs, workers)
    if build.engine == "ray":
        return run_ray(jobs, build.ray_address, workers, int(build.max_retries))
    raise DataError(f"build.engine must be one of {', '.join(ENGINES)}, got {build.engine!r}")
