"""Encoding texts in one process or in several CPU worker processes, behind one ``encode(texts)``.

The encoder is handed in as ``make_encoder(name, device=..., precision=...)``
(``gsdistill.models.text_encoder.TextEncoder`` in the commands): this data layer never imports the
models package. An encoder object
has ``dim`` and ``encode(texts, batch_size) -> [N, D]`` (a tensor or an array); vectors come back
as float32 numpy rows in the order of ``texts``.

Why worker processes: on a CPU, torch's intra-op threads split every small matrix product of a
MiniLM batch, and their synchronisation costs grow with the thread count; ``workers`` processes of
``cores // workers`` threads each encode whole pieces side by side instead. On a GPU one process
does the work (``workers`` is ignored there).
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
from typing import Callable

import numpy as np

from gsdistill.tuples.worker_guard import (exit_with_parent, ignore_interrupts, interrupts_ignored_while_starting,
                                           second_interrupt_kills_workers)

_worker_encoder = None  # the encoder of a worker process, built once by its initializer
_worker_error: Exception | None = None  # why it could not be built: raised by the worker's first task
# A worker's memory creeps up with the texts it has encoded (oneDNN keeps kernels per input shape,
# and sorted batches give nearly every batch a new shape; freed activations stay in malloc's heap):
# +470 MiB from 200 to 2,000 real pages. So its kernel cache is kept small, the heap is handed back
# after every piece, and a worker is replaced after this many pieces (~3 s to start one).
PIECES_PER_WORKER = 100


def _release_heap() -> None:
    """Give memory freed by torch back to the system (glibc only; elsewhere nothing to do)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _start_worker(make_encoder: Callable, name: str, threads: int, precision: str, parent_pid: int) -> None:
    # a thread, not the kernel's death signal: multiprocessing.Pool starts replacement workers from
    # a handler thread that ends before they do (see worker_guard)
    exit_with_parent(parent_pid, kernel_signal=False)
    ignore_interrupts()  # Ctrl-C is the owner's to handle (worker_guard)
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")  # read when oneDNN first runs: not yet
    import torch
    global _worker_encoder, _worker_error
    torch.set_num_threads(threads)
    try:
        _worker_encoder = make_encoder(name, device="cpu", precision=precision)
    except Exception as e:  # raised from an initializer, the pool would start workers forever
        _worker_error = e


def _worker_dim() -> int:
    if _worker_error is not None:
        raise _worker_error
    return int(_worker_encoder.dim)


def _encode_piece(args: tuple[list[str], int]) -> np.ndarray:
    texts, batch_size = args
    rows = as_rows(_worker_encoder.encode(texts, batch_size=batch_size), _worker_encoder.dim)
    _release_heap()
    return rows


def as_rows(vectors, dim: int) -> np.ndarray:
    """An encoder's output (torch tensor or array) as a float32 ``[N, dim]`` numpy array."""
    if hasattr(vectors, "detach"):
        vectors = vectors.detach().cpu().numpy()
    return np.asarray(vectors, dtype=np.float32).reshape(-1, dim)


class EncoderPool:
    """``encode(texts) -> float32 [N, D]`` with one encoder in this process (``workers`` <= 1 or a
    GPU ``device``) or ``workers`` spawned processes of ``threads`` torch threads each.

    With workers, the texts are sorted by length and cut into pieces of ``4 * batch_size``, so every
    piece holds texts of about one length (little padding) and the pieces keep all workers busy.
    Use as a context manager (the processes end on exit)."""

    def __init__(self, make_encoder: Callable, name: str, device: str = "cpu", workers: int = 1,
                 threads: int = 1, batch_size: int = 64, precision: str = "fp32"):
        if int(workers) < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.batch_size, self.workers = int(batch_size), int(workers) if device == "cpu" else 1
        self._pool, self._encoder = None, None
        if self.workers > 1:
            # spawn, not fork: a parent that already ran torch (pretraining, the demo) would hand a
            # forked child a broken OpenMP pool
            ctx = multiprocessing.get_context("spawn")
            self._interrupts = second_interrupt_kills_workers("the text encoding")
            self._interrupts.__enter__()  # left in close(): while the pool lives, a second Ctrl-C kills it
            with interrupts_ignored_while_starting():
                self._pool = ctx.Pool(self.workers, initializer=_start_worker, maxtasksperchild=PIECES_PER_WORKER,
                                      initargs=(make_encoder, name, int(threads), precision, os.getpid()))
            try:
                self.dim = int(self._pool.apply(_worker_dim))
            except BaseException:
                self._pool.terminate()
                self._pool = None
                self._interrupts.__exit__(None, None, None)
                raise
        else:
            self._encoder = make_encoder(name, device=device, precision=precision)
            self.dim = int(self._encoder.dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        if self._pool is None:
            rows = as_rows(self._encoder.encode(texts, batch_size=self.batch_size), self.dim)
            _release_heap()
            return rows
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        size = 4 * self.batch_size
        pieces = [([texts[i] for i in order[s:s + size]], self.batch_size) for s in range(0, len(order), size)]
        rows = np.concatenate(self._pool.map(_encode_piece, pieces, chunksize=1))
        out = np.empty_like(rows)
        out[np.asarray(order)] = rows
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None
            self._interrupts.__exit__(None, None, None)

    def __enter__(self) -> "EncoderPool":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None and exc[0] is not None:
            self._pool.terminate()  # an error (Ctrl-C) mid-way: do not wait for pending pieces
        self.close()

