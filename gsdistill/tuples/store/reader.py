"""Page-tuple store: WebDataset-layout tar shards plus a manifest (written by ``writer``).

Layout of ``out_dir``::

    shard-000000.tar     <key>.zst|png|jpg (page image: image_codec), <key>.json (everything but the image)
    manifest.json        counts per class, pages per shard, every skipped input with its reason
    embeddings/          optional cached text embeddings (gsdistill.tuples.store.text_cache), one .npz per shard

The tar members of one page are consecutive, as WebDataset expects, so the same shards stream
from local disk or object storage with any WebDataset reader (``webdataset.WebDataset(urls)``
yields every page as ``{"__key__", "zst", "json"}``). ``ShardDataset`` streams them back split
**by shard** over ranks x DataLoader workers (``split``: each reader streams one contiguous
run of the epoch's shards and opens only those), with a seeded shard order and shuffle buffer, resumable mid-epoch without decoding or
augmenting the pages it skips; PNG images are decoded lazily.
"""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
import warnings
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

from gsdistill.errors import corrupt
from gsdistill.tuples.errors import DataError
from gsdistill.tuples.store.image_codec import FORMATS, ZstdUnavailable, decode_zst, image_kind
from gsdistill.tuples.store.split import ShardPart, batches_before, reader_page_count, reader_parts
from gsdistill.tuples.store.writer import FORMAT, MANIFEST, page_json, sample_key, write_shards

__all__ = ["FORMAT", "MANIFEST", "ShardDataset", "decode_sample", "iter_tar", "list_shards", "page_json",
           "read_manifest", "read_pages", "sample_key", "shard_digest", "write_shards"]


def read_manifest(path: str | Path) -> dict:
    folder = Path(path)
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise DataError(f"{folder}: no {MANIFEST}; is this a shard directory (gsdistill tuples build)?")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # truncated, overwritten, not UTF-8
        raise corrupt(mpath, e, "manifest") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise DataError(f"{mpath}: format {found!r}, expected {FORMAT!r}")
    return manifest


def list_shards(path: str | Path) -> list[Path]:
    """Shard files of a shard dir (manifest order) or one ``.tar`` file."""
    p = Path(path)
    if p.is_file() and p.suffix == ".tar":
        return [p]
    manifest = read_manifest(p)
    files = [p / s["name"] for s in manifest["shards"]]
    absent = [f.name for f in files if not f.is_file()]
    if absent:
        raise DataError(f"{p}: manifest lists shards that are missing: {absent[:5]}")
    return files


def _open_shard(path: Path) -> BinaryIO:
    """Every shard byte a reader gets comes through here (one place to swap in remote storage)."""
    return open(path, "rb")


def iter_tar(path: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) per sample, grouping consecutive members with the same key;
    the tar is streamed front to back once (``r|``), as from object storage."""
    key, parts = None, {}
    try:
        with _open_shard(Path(path)) as fh, tarfile.open(fileobj=fh, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                k, _, ext = member.name.partition(".")
                if k != key and key is not None:
                    yield key, parts
                    parts = {}
                key = k
                parts[ext] = tar.extractfile(member).read()
    except tarfile.TarError as e:
        raise DataError(f"{path}: unreadable shard ({e})") from None
    if key is not None:
        yield key, parts


# a shard whose bytes changed after its build no longer matches its build record: the build rebuilds it
REBUILD_SHARD = "rebuild this shard (gsdistill tuples build with the same command)"


def shard_digest(path: Path) -> str:
    """sha256 of a shard's page records (every ``.json`` member, its name and bytes, in order): what
    the texts of its pages are made of, so the text-embedding cache is keyed by it. Reads only the
    tar headers and the json members (images are seeked over), a few ms a shard."""
    h = hashlib.sha256()
    try:
        with _open_shard(Path(path)) as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".json"):
                    h.update(member.name.encode() + b"\0" + tar.extractfile(member).read() + b"\0")
    except (tarfile.TarError, OSError) as e:
        raise DataError(f"{path}: unreadable shard ({type(e).__name__}: {e})") from None
    return h.hexdigest()


def _checked_image(img: bytes, where: str) -> Image.Image:
    """The page image after a check of its bytes, its format told by its first bytes (never by the
    member's name: builds without ``zstandard`` once stored PNG bytes under ``.zst`` names): ``zst``
    decoded at once (its frame checksum), a PNG opened lazily (pixels decoded on first use) after its
    chunk checksums, a JPEG (no checksums) decoded. A ``zst`` page where ``zstandard`` is missing or
    broken is refused as such, not as damaged."""
    kind = image_kind(img)
    try:
        if kind == "zst":
            return Image.fromarray(decode_zst(img))
        if kind == "png":
            Image.open(io.BytesIO(img)).verify()
            return Image.open(io.BytesIO(img))
        image = Image.open(io.BytesIO(img))
        image.load()
        return image
    except ZstdUnavailable as e:
        raise DataError(f"{where}: {e}") from None
    except Exception as e:  # DamagedImage, OSError, SyntaxError ("broken PNG file"), DecompressionBombError, ...
        raise DataError(f"{where}: damaged page image ({type(e).__name__}: {e}); {REBUILD_SHARD}") from None


def decode_sample(key: str, parts: dict[str, bytes], source: str, decode_images: bool = True) -> dict:
    """One page from its tar members; a damaged member is a DataError naming the shard and member."""
    if "json" not in parts:
        raise DataError(f"{source}: sample {key!r} has no .json member")
    try:
        page = json.loads(parts["json"])
    except ValueError as e:  # bad UTF-8 or bad JSON: bytes overwritten inside the shard
        raise DataError(f"{source}: member {key}.json is damaged ({type(e).__name__}: {e}); {REBUILD_SHARD}") from None
    if not isinstance(page, dict):
        raise DataError(f"{source}: member {key}.json holds a {type(page).__name__}, not a page record")
    ext = next((e for e in FORMATS if e in parts), None)
    img = parts.get(ext)
    if img is None:
        raise DataError(f"{source}: sample {key!r} has no image member")
    page["image"] = _checked_image(img, f"{source}: member {key}.{ext}") if decode_images else img
    page["_key"] = key
    return page


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _shard_pages(path: Path, files: list[Path]) -> list[int]:
    if path.is_dir():
        return [int(s["pages"]) for s in read_manifest(path)["shards"]]
    return [sum(1 for _ in iter_tar(f)) for f in files]


class ShardDataset(IterableDataset):
    """Stream page tuples from shards, each (rank, worker) reader reading only its own shards.

    Epoch ``e`` visits the shards in an order seeded by ``(seed, e)`` (stored order when
    ``shuffle_buffer`` <= 1) and shuffles each reader's pages through a buffer seeded by
    ``(seed, e, reader)``. Resuming: ``load_state_dict`` (one process: pages already yielded) or
    ``skip_batches`` (a DataLoader's batches already consumed, over any number of workers). Skipped
    pages are read (the shuffle needs them) but never decoded, given embeddings or transformed.
    ``embeddings``: a reader of cached text embeddings (``text_cache.open_embeddings(path)``, or
    anything with ``for_shard(shard_path, digest) -> lookup(key) -> {"sem_emb": ..., ...}``, ``digest``
    being ``shard_digest(shard_path)``) whose vectors
    are attached to each page; ``None`` (or ``False``), pages without them. This module reads shards
    only: it is handed the cache reader, never opens the cache itself.
    """

    def __init__(self, path: str | Path, shuffle_buffer: int = 0, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, decode_images: bool = True, transform=None,
                 embeddings=None):
        self.path = Path(path)
        self.files = list_shards(self.path)
        self.shuffle_buffer, self.seed = int(shuffle_buffer), int(seed)
        dist_rank, dist_world = _dist()
        self.rank = dist_rank if rank is None else int(rank)
        self.world_size = dist_world if world_size is None else int(world_size)
        self.decode_images, self.transform = decode_images, transform
        self.epoch, self._skip, self._skip_batches = 0, 0, None
        self._pages_per_shard: list[int] | None = None
        if embeddings is not None and embeddings is not False and not hasattr(embeddings, "for_shard"):
            raise TypeError(f"embeddings must be a cache reader (text_cache.open_embeddings(path)) or None, "
                            f"got {embeddings!r}")
        self.embeddings = embeddings or None  # False, as older callers pass it, means none too

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "yielded": self._skip}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._skip = int(state["epoch"]), int(state["yielded"])

    def skip_batches(self, batches: int, batch_size: int) -> None:
        """Start the next iteration after the first ``batches`` batches of ``batch_size`` pages that a
        DataLoader (``drop_last=True``, any ``num_workers``) over this dataset would return."""
        self._skip_batches = (int(batches), int(batch_size))

    def shard_order(self) -> list[int]:
        n = len(self.files)
        if self.shuffle_buffer <= 1:
            return list(range(n))
        return [int(i) for i in np.random.default_rng([self.seed, self.epoch]).permutation(n)]

    def pages_per_shard(self) -> list[int]:
        if self._pages_per_shard is None:
            self._pages_per_shard = _shard_pages(self.path, self.files)
        return self._pages_per_shard

    def reader_parts(self, reader: int, readers: int) -> list[ShardPart]:
        return reader_parts(self.shard_order(), self.pages_per_shard(), reader, readers)

    def _resume(self, workers: int) -> tuple[list[int], int]:
        """(pages to skip per worker, worker rotation) for the pending ``skip_batches`` / state."""
        if self._skip_batches is None:
            return [self._skip] * workers, 0
        batches, size = self._skip_batches
        order, readers = self.shard_order(), self.world_size * workers
        per_worker = [reader_page_count(order, self.pages_per_shard(), self.rank * workers + w, readers) // size
                      for w in range(workers)]
        taken, rotation = batches_before(batches, per_worker)
        return [t * size for t in taken], rotation

    def _raw(self, parts: list[ShardPart]) -> Iterator[tuple[Path, str, dict]]:
        for part in parts:
            f = self.files[part.shard]
            for index, (key, members) in enumerate(iter_tar(f)):
                if index >= part.stop:
                    break  # the rest of this shard is another reader's: stop reading it
                if index >= part.start:
                    yield f, key, members

    def _shuffled(self, items: Iterator, rng: np.random.Generator) -> Iterator:
        buf: list = []
        for item in items:
            buf.append(item)
            if len(buf) >= self.shuffle_buffer:
                yield buf.pop(int(rng.integers(len(buf))))
        while buf:
            yield buf.pop(int(rng.integers(len(buf))))

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        skips, rotation = self._resume(nw)
        self._skip, self._skip_batches = 0, None
        wid = (wid + rotation) % nw  # a restarted DataLoader begins its round robin at worker 0
        reader, readers = self.rank * nw + wid, self.world_size * nw
        if len(self.files) < readers and reader == 0:
            warnings.warn(f"{self.path}: {len(self.files)} shards for {readers} readers (ranks x workers): "
                          "splitting shards by page, so readers read each other's bytes; write more shards "
                          "(smaller build.pages_per_shard) to split by shard", stacklevel=2)
        stream = self._raw(self.reader_parts(reader, readers))
        if self.shuffle_buffer > 1:
            stream = self._shuffled(stream, np.random.default_rng([self.seed, self.epoch, reader]))
        skip = skips[wid]
        emb_for: dict[Path, object] = {}
        for i, (f, key, members) in enumerate(stream):
            if i < skip:
                continue
            self._skip = i + 1
            page = decode_sample(key, members, str(f), self.decode_images)
            if self.embeddings is not None:
                if f not in emb_for:  # the cache refuses vectors of a shard whose pages changed since
                    emb_for[f] = self.embeddings.for_shard(f, shard_digest(f))
                page.update(emb_for[f](key))
            yield self.transform(page) if self.transform is not None else page


def read_pages(path: str | Path, decode_images: bool = True, embeddings=None) -> Iterator[dict]:
    """Every page of a shard dir in stored order (one process, no shuffle); ``embeddings`` as in
    :class:`ShardDataset`."""
    yield from ShardDataset(path, rank=0, world_size=1, decode_images=decode_images, embeddings=embeddings)
