"""Writing the page-tuple store: WebDataset-layout tar shards plus ``manifest.json``.

Per page two consecutive tar members ``<key>.zst|png|jpg`` (the page image, ``image_codec``) and ``<key>.json`` (the
tuple without its image), so any WebDataset reader groups them into one sample. ``<key>`` is the
page id escaped injectively (``sample_key``): two different ids never share a key, so ids derived
from relative paths (``report/v1.pdf`` and ``report_v1.pdf``) never collide. A page id that
really repeats is recorded as a skip ("duplicate page id") and the build goes on; a shard is
renamed from ``.tmp`` when closed, also when the page iterator fails half-way.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Iterable

from tqdm import tqdm

from gsdistill.tuples.errors import SkipLog, reason_key
from gsdistill.tuples.store.image_codec import FORMATS, encode_image, image_kind, stored_format

FORMAT = "gsdistill-shards/1"
MANIFEST = "manifest.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9\-]")
DUPLICATE = "duplicate page id: an earlier page has the same id; this one is not written"


def sample_key(page_id: str) -> str:
    """WebDataset keys may not hold dots or slashes (they split key and extension). Every other
    character than ``A-Za-z0-9-`` (``_`` included) becomes ``_`` + its UTF-8 bytes in hex, which
    is injective: ``report/v1`` -> ``report_2fv1``, ``report_v1`` -> ``report_5fv1``."""
    return _UNSAFE.sub(lambda m: "".join(f"_{b:02x}" for b in m.group().encode("utf-8")), str(page_id))


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (a shard's, recorded in the manifest: what a resume compares)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0  # fixed mtime: identical inputs give identical shards
    tar.addfile(info, io.BytesIO(data))


def page_json(page: dict) -> dict:
    return {k: v for k, v in page.items() if k != "image" and not k.endswith("_emb")}


def accept_page(page: dict, seen: set[str], skips: SkipLog) -> str | None:
    """The page's sample key, or None after recording why it is not written (no image, no text
    span, or an id already written: ``seen`` holds the keys written so far and gains this one)."""
    pid = str(page.get("id", ""))
    if page.get("image") is None:
        skips.add(pid or "?", "no image")
        return None
    if not page.get("spans"):
        skips.add(pid, "no text: page has no spans")
        return None
    key = sample_key(pid)
    if key in seen:
        skips.add(pid, DUPLICATE)
        return None
    seen.add(key)
    return key


def page_members(page: dict, key: str, image_format: str, jpeg_quality: int) -> list[tuple[str, bytes]]:
    """The two tar members of one page: encoded image (named by what its bytes are: ``png`` for a
    ``zst`` build without a working ``zstandard``), then its json."""
    image = encode_image(page["image"], image_format, jpeg_quality)
    return [(image_kind(image), image),
            ("json", json.dumps(page_json(page), ensure_ascii=False).encode())]


class PageStats:
    """Counts for the manifest over the pages written: boxes and pages per class, sources, documents."""

    def __init__(self):
        self.classes, self.pages_with, self.sources = Counter(), Counter(), Counter()
        # pages per count of spans / boxes on a page ({"40": 3}: 3 pages hold 40): what a bound such as
        # views.max_spans cuts is known at a run's start without reading the shards
        self.span_counts, self.box_counts = Counter(), Counter()
        self.docs: set[str] = set()
        self.spans = 0

    def add(self, page: dict) -> None:
        cats = [b["category"] for b in page.get("boxes", [])]
        self.classes.update(cats)
        self.pages_with.update(set(cats))
        self.sources[page.get("source", "?")] += 1
        self.docs.add(str(page.get("doc_id", page.get("id"))))
        self.spans += len(page["spans"])
        self.span_counts[str(len(page["spans"]))] += 1
        self.box_counts[str(len(cats))] += 1

    def merge(self, summary: dict) -> None:
        """Add the counts of another ``summary()`` (a build unit's record)."""
        self.classes.update(summary["boxes_per_class"])
        self.pages_with.update(summary["pages_with_class"])
        self.sources.update(summary["sources"])
        self.docs.update(summary["doc_ids"])
        self.spans += summary["spans"]
        self.span_counts.update(summary.get("pages_by_span_count", {}))
        self.box_counts.update(summary.get("pages_by_box_count", {}))

    def summary(self) -> dict:
        # sorted: the same manifest bytes whatever order pages (and set iteration) came in
        return {"boxes_per_class": dict(sorted(self.classes.items())),
                "pages_with_class": dict(sorted(self.pages_with.items())),
                "sources": dict(sorted(self.sources.items())), "doc_ids": sorted(self.docs), "spans": self.spans,
                "pages_by_span_count": dict(sorted(self.span_counts.items(), key=lambda kv: int(kv[0]))),
                "pages_by_box_count": dict(sorted(self.box_counts.items(), key=lambda kv: int(kv[0])))}


def assemble_manifest(shards: list[dict], summary: dict, skipped: list[dict]) -> dict:
    """``manifest.json``'s content from the shards written, a ``PageStats.summary()`` and every skip."""
    return {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "pages": sum(s["pages"] for s in shards), "documents": len(summary["doc_ids"]), "spans": summary["spans"],
            "shards": shards, "boxes_per_class": summary["boxes_per_class"],
            "pages_with_class": summary["pages_with_class"], "sources": summary["sources"],
            "pages_by_span_count": summary["pages_by_span_count"], "pages_by_box_count": summary["pages_by_box_count"],
            "skipped_count": len(skipped), "skip_reasons": dict(Counter(reason_key(s["reason"]) for s in skipped)),
            "skipped": skipped}


class _ShardFiles:
    """Rolls over to a new ``shard-NNNNNN.tar`` every ``pages_per_shard`` pages."""

    def __init__(self, out: Path, pages_per_shard: int):
        self.out, self.per = out, pages_per_shard
        self.shards: list[dict] = []
        self.tar: tarfile.TarFile | None = None

    def add_page(self, key: str, members: list[tuple[str, bytes]]) -> None:
        if self.tar is None or self.shards[-1]["pages"] == self.per:
            self.close()
            self.shards.append({"name": f"shard-{len(self.shards):06d}.tar", "pages": 0})
            self.tar = tarfile.open(self.out / (self.shards[-1]["name"] + ".tmp"), "w")
        for ext, data in members:
            _add(self.tar, f"{key}.{ext}", data)
        self.shards[-1]["pages"] += 1

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()
            shard = self.out / self.shards[-1]["name"]
            (self.out / (shard.name + ".tmp")).replace(shard)
            self.shards[-1].update(bytes=shard.stat().st_size, sha256=file_sha256(shard))
            self.tar = None


def write_shards(pages: Iterable[dict], out_dir: str | Path, pages_per_shard: int = 256,
                 image_format: str = "zst", jpeg_quality: int = 90, skips: SkipLog | None = None,
                 progress: bool = True, total: int | None = None) -> dict:
    """Write ``pages`` as shards + manifest into ``out_dir``; return the manifest.

    ``skips``: the builders' skip log; its entries (input, reason) are copied into the manifest.
    Pages without an image, without any text span, or with an id already written are skipped and recorded.
    """
    if image_format not in FORMATS:
        raise ValueError(f"image_format must be one of {' | '.join(FORMATS)}, got {image_format!r}")
    out = Path(out_dir)
    stored_format(image_format)  # one line, before the first page, where zst falls back to png
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("shard-*.tar"), *out.glob("shard-*.tar.tmp")]:
        old.unlink()
    local_skips = SkipLog()
    files = _ShardFiles(out, pages_per_shard)
    stats, seen = PageStats(), set()
    try:
        for page in tqdm(pages, total=total, desc=f"shards -> {out.name}", unit="page", disable=not progress):
            key = accept_page(page, seen, local_skips)
            if key is not None:
                files.add_page(key, page_members(page, key, image_format, jpeg_quality))
                stats.add(page)
    finally:
        files.close()
    manifest = assemble_manifest(files.shards, stats.summary(), list(skips or []) + list(local_skips))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
    return manifest
