"""Batches for the training loop, with a resumable position ``{"epoch", "batch"}``.

:class:`ShardBatches` streams page tuples from a shard dir (split by rank), applies the multi-crop
views and collates them; epoch ``e`` uses seeds derived from ``(seed, e)``, so the stream is a pure
function of its position and resuming skips the epoch's first batches without augmenting them.
:class:`FixedBatches` cycles over prepared global batches, each rank taking its slice of pages
(tests and benchmarks: the same global batch on 1 or N processes).
Both give every batch of a run one shape (``gsdistill.views.fixed_shapes``: a compiled step compiles once):
the shard stream pads to bounds from the config and manifest, drawing each batch's iBOT masks at once
(``batch_masks``) in its workers; :class:`FixedBatches` pads to the largest counts of its batches.
With ``views.device`` on the GPU (``gsdistill.views.batched_views``) the workers send each page once, padded
to the run's canvas, with a row of crop parameters per view; the step makes the views' pixels.
"""
from __future__ import annotations

import sys
import zlib
from collections import Counter
from functools import partial
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from gsdistill.models.gsdistill_model import masked_patch_index
from gsdistill.models.view_batch import masked_view_index
from gsdistill.pretrain.random_batches import ibot_masks, tensor_batch  # noqa: F401  (imported from here)
from gsdistill.threads import default_threads, limit_worker_threads
from gsdistill.tuples.errors import DataError
from gsdistill.views.batched_views import page_canvas, views_in_step
from gsdistill.views.fixed_shapes import MASK_KEYS, BatchShapes, covering_shapes, pad_batch, run_shapes, shard_manifest
from gsdistill.views.masking import batch_masks


def slice_batch(batch: dict, rank: int, world: int) -> dict:
    """This rank's pages of a view-major global batch (``[v0 pages, v1 pages, ...]`` per view tensor)."""
    n_pages = len(batch["ids"])
    if n_pages % world:
        raise ValueError(f"global batch of {n_pages} pages does not split over {world} ranks")
    per = n_pages // world
    lo, hi = rank * per, (rank + 1) * per
    out = {}
    for key, value in batch.items():
        if key in HOST_INDICES:  # indices into the whole batch's masks: recomputed by to_device
            continue
        if key == "ids":
            out[key] = value[lo:hi]
        elif isinstance(value, torch.Tensor) and key in VIEW_MAJOR:
            views = value.shape[0] // n_pages
            out[key] = value.reshape(views, n_pages, *value.shape[1:])[:, lo:hi].reshape(views * per, *value.shape[1:])
        elif isinstance(value, torch.Tensor):
            out[key] = value[lo:hi]
        else:
            out[key] = value
    return out


HOST_INDICES = MASK_KEYS  # with their padding flags (fixed_shapes.padded_host_indices)
VIEW_MAJOR = ("global_crops", "local_crops", "global_params", "local_params", "masks", "region_pool")


def host_indices(masks: torch.Tensor) -> dict:
    """The iBOT masks' flat indices (``mask_index``) and the rows of the masked views
    (``masked_views``), computed where the masks are: on the host they cost no device sync."""
    return {"mask_index": masked_patch_index(masks), "masked_views": masked_view_index(masks)}


def to_device(batch: dict, device: torch.device) -> dict:
    """Move a (this rank's) batch to ``device``; the iBOT masks' indices are computed here, on the
    host where the masks still are, so the model's ``patches[masks]`` costs no GPU host sync. Crops
    travel as they come (``uint8`` from the views pipeline: a quarter of float32's bytes) and are
    normalised on the device by the model."""
    if isinstance(batch.get("masks"), torch.Tensor) and "mask_index" not in batch and batch["masks"].device.type == "cpu":
        batch = {**batch, **host_indices(batch["masks"])}
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class FixedBatches:
    """Cycle over ``global_batches`` (collated dicts); position = index of the next batch."""

    def __init__(self, global_batches: list[dict], rank: int = 0, world: int = 1):
        if not global_batches:
            raise ValueError("FixedBatches needs at least one batch")
        slices = [[slice_batch(b, r, world) for b in global_batches] for r in range(world)]
        shapes = covering_shapes(sum(slices, []))  # one shape on every rank and step
        self.batches = [pad_batch(b, shapes)[0] if shapes else b for b in slices[rank]]
        self.position = {"epoch": 0, "batch": 0}

    def restore(self, position: dict) -> None:
        self.position = dict(position)

    def __next__(self) -> dict:
        i = self.position["batch"]
        self.position = {"epoch": 0, "batch": i + 1}
        return self.batches[i % len(self.batches)]

    def __iter__(self) -> Iterator[dict]:
        return self


class _EpochBatches:
    """One rank's whole batches of one epoch, from whichever process runs it (a DataLoader worker,
    or the main process when there are none); small and picklable, it is what workers receive."""

    def __init__(self, shard_dir: str, cfg, rank: int, world: int, local_batch: int, patch_size: int):
        self.shard_dir, self.cfg, self.rank, self.world = shard_dir, cfg, rank, world
        self.local_batch, self.patch_size = local_batch, patch_size
        self.seed = int(cfg["train"]["seed"])
        v, self.grid = cfg["views"], (int(cfg["views"]["global_size"]) // patch_size,) * 2
        self.mask_prob, self.mask_ratio = float(v["mask_prob"]), tuple(float(r) for r in v["mask_ratio"])
        manifest = shard_manifest(shard_dir)
        self.shapes: BatchShapes = run_shapes(cfg, local_batch, self.grid, manifest)
        # views made in the step: decided here, in the main process, which knows the training device
        self.in_step = views_in_step(cfg)
        self.canvas = page_canvas(shard_dir, manifest) if self.in_step else None

    def dataset(self, epoch: int):
        from gsdistill.tuples.store.reader import ShardDataset
        from gsdistill.tuples.store.text_cache import fields_for, open_embeddings
        from gsdistill.views.batched_views import BatchedViews
        from gsdistill.views.multicrop import MultiCropViews

        v, d = self.cfg["views"], self.cfg["data"]
        # a cache without what the objective reads is a DataError naming the command that adds it (no cache
        # at all: collate_pretrain names the command)
        cache = open_embeddings(self.shard_dir, fields=fields_for(str(self.cfg["objective"]["positives"])))
        # every views key, local_mode and local_span_px included (a hand-written list here once left them out:
        # runs asking for span-centred local views trained on random ones)
        kind, extra = (BatchedViews, {"canvas": self.canvas}) if self.in_step else (MultiCropViews, {})
        views = kind.from_config(v, self.patch_size, seed=self.seed * 100003 + epoch * 1009 + self.rank,
                                 region_boxes=bool(self.cfg["objective"].get("region_geom", False)),
                                 page_masks=False, **extra)
        # views made in the step decode the shard's bytes themselves (OpenCV: BatchedViews)
        dataset = ShardDataset(self.shard_dir, shuffle_buffer=int(d["shuffle_buffer"]), seed=self.seed,
                               rank=self.rank, world_size=self.world, transform=views, embeddings=cache,
                               decode_images=not self.in_step)
        dataset.set_epoch(epoch)
        return dataset

    def per_reader(self, readers: int) -> int:
        """Whole batches every one of this rank's ``readers`` can make an epoch (the fewest of any)."""
        from gsdistill.tuples.store.split import reader_page_count
        from gsdistill.tuples.store.reader import ShardDataset

        shard_pages = ShardDataset(self.shard_dir, rank=self.rank, world_size=self.world,
                                   embeddings=False).pages_per_shard()
        order = list(range(len(shard_pages)))  # a reader's page count does not depend on the order
        return min(reader_page_count(order, shard_pages, self.rank * readers + w, self.world * readers)
                   for w in range(readers)) // self.local_batch

    def batches(self, epoch: int, skip_rounds: int, readers: int) -> Iterator[tuple[dict, dict]]:
        """This reader's ``(batch, what padding cut)`` of ``epoch`` after its first ``skip_rounds`` (skipped
        pages are neither decoded nor augmented); the dataset and its views are built at once."""
        count = self.per_reader(readers) - skip_rounds
        dataset = self.dataset(epoch)
        dataset.skip_batches(skip_rounds * readers, self.local_batch)
        return self._collated(iter(dataset), count, epoch)

    def _collated(self, pages: Iterator[dict], count: int, epoch: int) -> Iterator[tuple[dict, dict]]:
        from gsdistill.views.multicrop import collate_pretrain

        made, batch = 0, []
        while made < count:  # pages beyond would make batches other workers cannot match this epoch
            batch.append(next(pages))
            if len(batch) == self.local_batch:
                padded, cut = pad_batch(collate_pretrain(batch, self._masks(batch, epoch)), self.shapes)
                if self.in_step:  # pages larger than the canvas, shrunk to fit it
                    cut["pages_shrunk"] = sum(s["pages_shrunk"] for s in batch)
                yield padded, cut
                made, batch = made + 1, []

    def _masks(self, pages: list[dict], epoch: int) -> torch.Tensor:
        """The batch's iBOT masks (view-major, as the crops): a pure function of the seed, the epoch and its
        pages, so a resumed stream draws them again."""
        ids = zlib.crc32("\n".join(str(p["id"]) for p in pages).encode("utf-8"))
        rng = np.random.default_rng([self.seed, epoch, self.rank, ids])
        n_views = len(pages) * int(self.cfg["views"]["n_global"])
        return torch.from_numpy(batch_masks(n_views, self.grid, self.mask_prob, self.mask_ratio, rng))


class _EndlessBatches(IterableDataset):
    """``(epoch, batch)`` over epochs ``start``, ``start + 1``, ... from each DataLoader worker. Every
    worker makes the same number of batches an epoch, so the DataLoader's round robin (worker 0, 1,
    ...) begins each epoch at worker 0, as a new DataLoader per epoch would, from workers that live
    for the whole run."""

    def __init__(self, epochs: _EpochBatches, start: int, skip_rounds: int):
        self.epochs, self.start, self.skip_rounds = epochs, start, skip_rounds

    def __iter__(self) -> Iterator[tuple[int, dict, dict]]:
        info = get_worker_info()
        readers = 1 if info is None else info.num_workers
        epoch, skip = self.start, self.skip_rounds
        while True:
            for batch, cut in self.epochs.batches(epoch, skip, readers):
                yield epoch, batch, cut
            epoch, skip = epoch + 1, 0


class ShardBatches:
    """Endless, resumable stream of collated pretraining batches from a shard dir with cached text
    embeddings. One DataLoader serves the whole run: its workers start once, not once an epoch, and
    stay busy across epoch boundaries. ``pin_memory`` (for CUDA): batches come in page-locked memory,
    so :func:`to_device`'s ``non_blocking`` copies really overlap the step."""

    def __init__(self, shard_dir: str, cfg, rank: int, world: int, local_batch: int, patch_size: int,
                 pin_memory: bool = False):
        self.shard_dir, self.rank, self.world, self.local_batch = shard_dir, rank, world, local_batch
        self.workers, self.pin_memory = int(cfg["data"]["num_workers"]), bool(pin_memory)
        self.epochs = _EpochBatches(shard_dir, cfg, rank, world, local_batch, patch_size)
        self.position = {"epoch": 0, "batch": 0}
        self._it: Iterator[tuple[int, dict, dict]] | None = None
        self.cut: Counter = Counter()  # what the fixed shapes cut so far (fixed_shapes.pad_batch)

    @property
    def shapes(self) -> BatchShapes:
        """The shape every batch of this run has."""
        return self.epochs.shapes

    def _epoch_iterator(self, epoch: int, skip_batches: int = 0) -> Iterator[dict]:
        """One epoch's batches in this process (no workers)."""
        return (batch for batch, _ in self.epochs.batches(epoch, skip_batches, 1))

    def _open(self, position: dict) -> None:
        readers = max(1, self.workers)
        per_reader = self.epochs.per_reader(readers)
        if per_reader == 0:
            raise DataError(f"{self.shard_dir}: rank {self.rank} of {self.world} has a DataLoader reader with "
                            f"fewer than {self.local_batch} pages an epoch (data.num_workers={self.workers}); "
                            "use more pages, fewer workers or a smaller batch")
        epoch = int(position["epoch"])
        rounds, extra = divmod(int(position["batch"]), readers)
        if rounds >= per_reader:  # the position is the epoch's end: the next batch opens the next one
            epoch, rounds, extra = epoch + 1, 0, 0
        from torch.utils.data import DataLoader
        # each worker gets the share of the cores the main process gets (gsdistill.threads)
        init = partial(limit_worker_threads, default_threads(self.workers)) if self.workers else None
        loader = DataLoader(_EndlessBatches(self.epochs, epoch, rounds), batch_size=None,
                            num_workers=self.workers, pin_memory=self.pin_memory, worker_init_fn=init)
        self._it = iter(loader)
        for _ in range(extra):  # batches of a part-done round: made again and dropped, to keep the order
            next(self._it)

    def restore(self, position: dict) -> None:
        """Rebuild the stream at ``position`` (the dataset skips the epoch's first batches unaugmented)."""
        self.position = {"epoch": int(position["epoch"]), "batch": int(position["batch"])}
        self._open(self.position)

    def __next__(self) -> dict:
        if self._it is None:
            self._open(self.position)
        epoch, batch, cut = next(self._it)
        self._count_cut(cut)
        if epoch != self.position["epoch"]:
            self.position = {"epoch": epoch, "batch": 0}
        self.position["batch"] += 1
        return batch

    def __iter__(self) -> Iterator[dict]:
        return self

    def _count_cut(self, cut: dict) -> None:  # never expected (the bounds hold what the views keep): said once
        cut = {k: int(v) for k, v in cut.items() if v}
        if cut and not self.cut:
            print(f"[pretrain] a batch exceeded the fixed batch shapes {self.shapes} and was cut to them ({cut}); "
                  "counted in the stream's `cut`", file=sys.stderr, flush=True)
        self.cut.update(cut)
