"""Which pages of which shards each reader streams: contiguous runs of the epoch's shard order.

A *reader* is one (rank, DataLoader worker) pair, ``reader = rank * workers + worker`` of
``readers = world_size * workers``. The epoch visits the shards in some order; laid end to end
their ``N`` pages are cut into ``readers`` contiguous runs, reader ``r`` taking pages
``[r * N // readers, (r + 1) * N // readers)``. So:

* every page is read by exactly one reader - nothing dropped, nothing repeated, and the readers'
  page counts differ by at most one (ranks stay in step: the same batches per epoch);
* a reader opens only the shards its run covers: ~1/readers of the bytes, plus at most the
  shards its run starts or ends inside (tars stream from their start, so a run starting inside
  a shard reads that shard's earlier members too; a run ending inside one stops early);
* with fewer shards than readers, runs cut shards into pieces and several readers stream the same
  shard: ``ShardDataset`` warns then (write more, smaller shards).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShardPart:
    """Pages ``start <= index < stop`` (stored order) of shard ``shard`` (index into the shard list)."""
    shard: int
    start: int
    stop: int

    @property
    def pages(self) -> int:
        return self.stop - self.start


def reader_parts(order: list[int], shard_pages: list[int], reader: int, readers: int) -> list[ShardPart]:
    """The shard parts reader ``reader`` of ``readers`` streams, for shards visited in ``order``."""
    if not 0 <= reader < readers:
        raise ValueError(f"reader {reader} out of range for {readers} readers")
    total = sum(shard_pages[s] for s in order)
    lo, hi = reader * total // readers, (reader + 1) * total // readers
    parts, offset = [], 0
    for s in order:
        n = shard_pages[s]
        start, stop = max(lo - offset, 0), min(hi - offset, n)
        if start < stop:
            parts.append(ShardPart(s, start, stop))
        offset += n
    return parts


def reader_page_count(order: list[int], shard_pages: list[int], reader: int, readers: int) -> int:
    total = sum(shard_pages[s] for s in order)
    return (reader + 1) * total // readers - reader * total // readers


def batches_before(batch: int, batches_per_worker: list[int]) -> tuple[list[int], int]:
    """(how many of the first ``batch`` batches a DataLoader took from each worker, the worker that
    gives batch number ``batch``).

    A DataLoader over an ``IterableDataset`` returns its workers' batches round robin (worker 0,
    1, ..., then 0 again), skipping workers that have run out; ``batches_per_worker[w]`` is how
    many complete batches worker ``w`` makes in the epoch. A restarted DataLoader begins again at
    worker 0, so a resumed stream lets worker ``p`` play worker ``(p + next) % workers``."""
    taken, left, w = [0] * len(batches_per_worker), batch, 0
    while left > 0 and any(t < n for t, n in zip(taken, batches_per_worker)):
        if taken[w] < batches_per_worker[w]:
            taken[w] += 1
            left -= 1
        w = (w + 1) % len(batches_per_worker)
    for _ in range(len(batches_per_worker)):  # the next worker that still has a batch
        if taken[w] < batches_per_worker[w]:
            break
        w = (w + 1) % len(batches_per_worker)
    return taken, w
