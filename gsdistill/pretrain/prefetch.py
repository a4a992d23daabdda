"""The next batch on its way to the GPU while the current step runs.

:class:`DeviceFeed` wraps a batch stream (``FixedBatches`` / ``ShardBatches``). On CUDA it keeps one
batch ahead: the host-to-device copy of batch ``i + 1`` is issued on a side stream before step ``i``
computes, so the copy overlaps the step instead of following it (the batches come in pinned memory
from the DataLoader, so ``non_blocking`` copies really are asynchronous). The compute stream waits
for the side stream before it reads the batch, and ``record_stream`` keeps the caching allocator
from reusing the batch's memory while the compute stream may still read it.

``position`` is the stream position after the last batch handed out (what a checkpoint must store),
not the stream's own, which is one batch further on. Elsewhere (CPU) it hands batches out as they
come, moved with :func:`to_device`.
"""
from __future__ import annotations

import torch

from gsdistill.pretrain.data_stream import to_device


class DeviceFeed:
    def __init__(self, batches, device: torch.device, ahead: bool | None = None):
        self.batches, self.device = batches, device
        self.ahead = device.type == "cuda" if ahead is None else bool(ahead)
        self.stream = torch.cuda.Stream(device) if self.ahead and device.type == "cuda" else None
        self._next: dict | None = None
        self._position = dict(batches.position)

    @property
    def position(self) -> dict:
        return dict(self._position) if self.ahead else dict(self.batches.position)

    def restore(self, position: dict) -> None:
        """Rewind the stream to ``position`` (a checkpoint's) and drop the batch fetched ahead."""
        self.batches.restore(position)
        self._next, self._position = None, dict(position)

    def _fetch(self) -> tuple[dict, dict]:
        batch = next(self.batches)
        after = dict(self.batches.position)
        if self.stream is None:
            return to_device(batch, self.device), after
        with torch.cuda.stream(self.stream):
            return to_device(batch, self.device), after

    def __next__(self) -> dict:
        if not self.ahead:
            return to_device(next(self.batches), self.device)
        batch, after = self._next if self._next is not None else self._fetch()
        if self.stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            for value in batch.values():
                if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                    value.record_stream(current)
        self._position = after
        self._next = self._fetch()  # the following batch's copy overlaps this step
        return batch
