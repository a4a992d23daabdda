"""Worker processes that end with the process that started them.

When the process that owns a pool is killed alone (``kill PID``, ``kill -9 PID``, the OOM killer),
nothing tells its workers: a ``ProcessPoolExecutor``'s forked workers wait on a pipe whose other end
their siblings hold, forever (parent PID 1, ~120 MB each: issue 33), and a ``multiprocessing.Pool``
worker first finishes the piece it is on, for nobody. A pool's initializer calls
:func:`exit_with_parent` so that they end within a second.

Ctrl-C: a terminal sends SIGINT to every process of the command. Pool workers ignore it (their owner
decides); the owner, while its pool runs (:func:`second_interrupt_kills_workers`), stops at the first
Ctrl-C after the work in progress (a unit finished is kept for the rerun) and, at a second one, kills
its worker processes and exits at once (code 130): a unit cut off leaves its shard as a ``.tmp`` file,
which the rerun discards.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_SECONDS = 0.5  # how often the watch thread looks at the parent


def _kill_on_parent_death() -> bool:
    """Linux: ask the kernel to SIGKILL this process the moment its parent dies (True if set).

    The kernel ties this to the parent *thread* that started the process; only use it for a pool
    whose workers are all started by a thread that lives as long as the pool (a
    ``ProcessPoolExecutor`` forking from the caller's thread, not ``multiprocessing.Pool``, whose
    handler thread replaces workers and ends before they do)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_SECONDS)
    os._exit(1)  # orphaned: the work it waits for will never come; its partial output is a .tmp file


def exit_with_parent(parent_pid: int, kernel_signal: bool = True) -> None:
    """Make this worker end soon after ``parent_pid`` (the pool owner, passed in by it) dies: a
    kernel death signal where asked and available, and a daemon thread that checks the parent every
    ``WATCH_SECONDS`` everywhere (the signal also ends a worker stuck in C code that holds the GIL, where the
    thread cannot run)."""
    if kernel_signal:
        _kill_on_parent_death()
    if os.getppid() != parent_pid:  # the parent died before the signal was set up
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="parent-watch", daemon=True).start()


def single_threaded() -> None:
    """One thread per worker: the workers already fill the cores (torch, OpenMP, Tesseract)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def start_pool_worker(parent_pid: int) -> None:
    """A pool worker's initializer: single-threaded, and ended with the build's main process (a
    killed build leaves no worker behind; its next run resumes)."""
    exit_with_parent(parent_pid)
    ignore_interrupts()
    single_threaded()


def ignore_interrupts() -> None:
    """A worker's part of Ctrl-C: none; the pool's owner stops or kills it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def kill_worker_processes() -> None:
    """SIGKILL every child process this process started with ``multiprocessing`` (every pool's)."""
    import multiprocessing
    for child in multiprocessing.active_children():
        try:
            child.kill()
        except (OSError, ValueError):  # already gone, or closed
            pass


@contextmanager
def second_interrupt_kills_workers(what: str):
    """While the block runs (a pool's lifetime, in the main thread): the first Ctrl-C does what it did
    (``KeyboardInterrupt``, or the handler installed before) and says in one line that a second one stops
    at once; the second kills the worker processes and ends the command with code 130, whatever the
    pool is waiting on (a manager thread, a pipe, a unit that takes minutes). ``what``: the work, in words."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):
        yield
        return
    presses = []

    def on_interrupt(signum, frame):
        presses.append(time.monotonic())
        if len(presses) == 1:
            print(f"interrupted: stopping {what} after the work in progress; press Ctrl-C again to stop at once",
                  file=sys.stderr, flush=True)
            if callable(previous) and previous is not signal.default_int_handler:
                return previous(signum, frame)
            raise KeyboardInterrupt
        kill_worker_processes()
        print(f"stopped at once: the {what} worker processes killed; work cut off is left as .tmp files, "
              "which the next run of the same command discards", file=sys.stderr, flush=True)
        os._exit(130)

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        if not presses:  # once pressed, the command is ending: a second press still ends it at once
            signal.signal(signal.SIGINT, previous)


@contextmanager
def interrupts_ignored_while_starting():
    """Start worker processes with SIGINT ignored: a spawned Python keeps an ignored SIGINT ignored, so a
    Ctrl-C while a worker still imports (torch: seconds) is no ``KeyboardInterrupt`` traceback in it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
