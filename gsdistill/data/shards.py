"""Page-tuple store: WebDataset-layout tar shards plus a manifest.

Layout of ``out_dir``::

    shard-000000.tar     <key>.png|jpg (page image), <key>.json (everything but the image)
    manifest.json        counts per class, pages per shard, every skipped input with its reason
    embeddings/          optional cached text embeddings (gsdistill.data.text_cache), one .npz per shard

The tar members of one page are consecutive, as WebDataset expects, so the same shards stream
from local disk or object storage with any WebDataset reader. ``ShardDataset`` streams them back,
split by rank and DataLoader worker, with a seeded shuffle buffer, resumable, images decoded lazily.
"""
from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info
from tqdm import tqdm

from gsdistill.data.errors import DataError, SkipLog

FORMAT = "gsdistill-shards/1"
MANIFEST = "manifest.json"


def sample_key(page_id: str) -> str:
    """WebDataset keys may not contain dots or slashes (they separate key and extension)."""
    return re.sub(r"[^A-Za-z0-9_\-]", "_", str(page_id))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0  # fixed mtime: identical inputs give identical shards
    tar.addfile(info, io.BytesIO(data))


def _image_bytes(image: Image.Image, fmt: str, quality: int) -> bytes:
    buf = io.BytesIO()
    image = image.convert("RGB")
    if fmt == "png":
        image.save(buf, format="PNG", compress_level=1)  # fast: shards are written often, read more
    else:
        image.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def page_json(page: dict) -> dict:
    return {k: v for k, v in page.items() if k != "image" and not k.endswith("_emb")}


def write_shards(pages: Iterable[dict], out_dir: str | Path, pages_per_shard: int = 256,
                 image_format: str = "png", jpeg_quality: int = 90, skips: SkipLog | None = None,
                 progress: bool = True, total: int | None = None) -> dict:
    """Write ``pages`` as shards + manifest into ``out_dir``; return the manifest.

    ``skips``: the builders' skip log; its entries (input, reason) are copied into the manifest.
    Pages without an image or without any text span are themselves skipped and recorded.
    """
    if image_format not in ("png", "jpg"):
        raise ValueError(f"image_format must be png or jpg, got {image_format!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("shard-*.tar"):
        old.unlink()
    local_skips = SkipLog()
    shards, classes, pages_with = [], Counter(), Counter()
    sources, docs, seen = Counter(), set(), set()
    n_spans = 0
    tar, count = None, 0

    def close():
        nonlocal tar
        if tar is not None:
            tar.close()
            tmp = out / (shards[-1]["name"] + ".tmp")
            tmp.replace(out / shards[-1]["name"])
            tar = None

    for page in tqdm(pages, total=total, desc=f"shards -> {out.name}", unit="page", disable=not progress):
        pid = str(page.get("id", ""))
        if page.get("image") is None:
            local_skips.add(pid or "?", "no image")
            continue
        if not page.get("spans"):
            local_skips.add(pid, "no text: page has no spans")
            continue
        key = sample_key(pid)
        if key in seen:
            raise DataError(f"duplicate page id {pid!r} (key {key!r}); ids must be unique in a shard set")
        seen.add(key)
        if tar is None or count == pages_per_shard:
            close()
            shards.append({"name": f"shard-{len(shards):06d}.tar", "pages": 0})
            tar, count = tarfile.open(out / (shards[-1]["name"] + ".tmp"), "w"), 0
        _add(tar, f"{key}.{image_format}", _image_bytes(page["image"], image_format, jpeg_quality))
        _add(tar, f"{key}.json", json.dumps(page_json(page), ensure_ascii=False).encode())
        count += 1
        shards[-1]["pages"] += 1
        cats = [b["category"] for b in page.get("boxes", [])]
        classes.update(cats)
        pages_with.update(set(cats))
        sources[page.get("source", "?")] += 1
        docs.add(page.get("doc_id", pid))
        n_spans += len(page["spans"])
    close()
    skipped = list(skips or []) + list(local_skips)
    n_pages = sum(s["pages"] for s in shards)
    manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "pages": n_pages,
                "documents": len(docs), "spans": n_spans, "shards": shards, "boxes_per_class": dict(classes),
                "pages_with_class": dict(pages_with), "sources": dict(sources),
                "skipped_count": len(skipped), "skip_reasons": dict(Counter(s["reason"].split(":")[0] for s in skipped)),
                "skipped": skipped}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
    return manifest


def read_manifest(path: str | Path) -> dict:
    folder = Path(path)
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise DataError(f"{folder}: no {MANIFEST}; is this a shard directory (gsdistill tuples build)?")
    manifest = json.loads(mpath.read_text())
    if manifest.get("format") != FORMAT:
        raise DataError(f"{mpath}: format {manifest.get('format')!r}, expected {FORMAT!r}")
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


def iter_tar(path: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) per sample, grouping consecutive members with the same key."""
    key, parts = None, {}
    try:
        with tarfile.open(path, "r") as tar:
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


def decode_sample(key: str, parts: dict[str, bytes], source: str, decode_images: bool = True) -> dict:
    if "json" not in parts:
        raise DataError(f"{source}: sample {key!r} has no .json member")
    page = json.loads(parts["json"])
    img = parts.get("png") or parts.get("jpg")
    if img is None:
        raise DataError(f"{source}: sample {key!r} has no image member")
    # Image.open reads only the header; pixels are decoded on first use (lazy decoding)
    page["image"] = Image.open(io.BytesIO(img)) if decode_images else img
    page["_key"] = key
    return page


def _split() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ShardDataset(IterableDataset):
    """Stream page tuples from shards; each (rank, worker) takes every ``splits``-th page.

    Cached embeddings (``text_cache``) are attached as ``sem_emb`` etc. when present and current.
    ``state_dict()/load_state_dict()`` resume a single-process stream after the pages already yielded.
    """

    def __init__(self, path: str | Path, shuffle_buffer: int = 0, seed: int = 0, rank: int | None = None,
                 world_size: int | None = None, decode_images: bool = True, transform=None,
                 embeddings: bool | str = "auto"):
        self.path = Path(path)
        self.files = list_shards(self.path)
        self.shuffle_buffer, self.seed = int(shuffle_buffer), int(seed)
        dist_rank, dist_world = _split()
        self.rank = dist_rank if rank is None else int(rank)
        self.world_size = dist_world if world_size is None else int(world_size)
        self.decode_images, self.transform = decode_images, transform
        self.epoch, self._skip = 0, 0
        self.embeddings = None
        if embeddings:
            from gsdistill.data.text_cache import open_embeddings
            self.embeddings = open_embeddings(self.path, required=embeddings is True)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "yielded": self._skip}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._skip = int(state["epoch"]), int(state["yielded"])

    def _pages(self, split: int, splits: int) -> Iterator[dict]:
        index = 0
        for f in self.files:
            emb = self.embeddings.for_shard(f) if self.embeddings is not None else None
            for key, parts in iter_tar(f):
                if index % splits == split:
                    page = decode_sample(key, parts, str(f), self.decode_images)
                    if emb is not None:
                        page.update(emb(key))
                    yield page
                index += 1

    def _shuffled(self, pages: Iterator[dict], rng: np.random.Generator) -> Iterator[dict]:
        buf: list[dict] = []
        for page in pages:
            buf.append(page)
            if len(buf) >= self.shuffle_buffer:
                yield buf.pop(int(rng.integers(len(buf))))
        while buf:
            yield buf.pop(int(rng.integers(len(buf))))

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        split, splits = self.rank * nw + wid, self.world_size * nw
        stream = self._pages(split, splits)
        if self.shuffle_buffer > 1:
            stream = self._shuffled(stream, np.random.default_rng([self.seed, self.epoch, split]))
        skip, self._skip = self._skip, 0
        for i, page in enumerate(stream):
            if i < skip:
                continue
            self._skip = i + 1
            yield self.transform(page) if self.transform is not None else page


def read_pages(path: str | Path, decode_images: bool = True, embeddings: bool | str = "auto") -> Iterator[dict]:
    """Every page of a shard dir in stored order (one process, no shuffle)."""
    yield from ShardDataset(path, rank=0, world_size=1, decode_images=decode_images, embeddings=embeddings)
