"""Writing the page-tuple store: WebDataset-layout tar shards plus ``manifest.json``.

Per page two consecutive tar members ``<key>.png|jpg`` (the page image) and ``<key>.json`` (the
tuple without its image), so any WebDataset reader groups them into one sample. ``<key>`` is the
page id escaped injectively (``sample_key``): two different ids never share a key, so ids derived
from relative paths (``report/v1.pdf`` and ``report_v1.pdf``) never collide. A page id that
really repeats is recorded as a skip ("duplicate page id") and the build goes on; a shard is
renamed from ``.tmp`` when closed, also when the page iterator fails half-way.
"""
from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Iterable

from PIL import Image
from tqdm import tqdm

from gsdistill.tuples.errors import SkipLog, reason_key

FORMAT = "gsdistill-shards/1"
MANIFEST = "manifest.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9\-]")


def sample_key(page_id: str) -> str:
    """WebDataset keys may not hold dots or slashes (they split key and extension). Every other
    character than ``A-Za-z0-9-`` (``_`` included) becomes ``_`` + its UTF-8 bytes in hex, which
    is injective: ``report/v1`` -> ``report_2fv1``, ``report_v1`` -> ``report_5fv1``."""
    return _UNSAFE.sub(lambda m: "".join(f"_{b:02x}" for b in m.group().encode("utf-8")), str(page_id))


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
            (self.out / (self.shards[-1]["name"] + ".tmp")).replace(self.out / self.shards[-1]["name"])
            self.tar = None


def write_shards(pages: Iterable[dict], out_dir: str | Path, pages_per_shard: int = 256,
                 image_format: str = "png", jpeg_quality: int = 90, skips: SkipLog | None = None,
                 progress: bool = True, total: int | None = None) -> dict:
    """Write ``pages`` as shards + manifest into ``out_dir``; return the manifest.

    ``skips``: the builders' skip log; its entries (input, reason) are copied into the manifest.
    Pages without an image, without any text span, or with an id already written are skipped and recorded.
    """
    if image_format not in ("png", "jpg"):
        raise ValueError(f"image_format must be png or jpg, got {image_format!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("shard-*.tar"), *out.glob("shard-*.tar.tmp")]:
        old.unlink()
    local_skips = SkipLog()
    files = _ShardFiles(out, pages_per_shard)
    classes, pages_with, sources, docs, seen = Counter(), Counter(), Counter(), set(), set()
    n_spans = 0
    try:
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
                local_skips.add(pid, "duplicate page id: an earlier page has the same id; this one is not written")
                continue
            seen.add(key)
            files.add_page(key, [(image_format, _image_bytes(page["image"], image_format, jpeg_quality)),
                                 ("json", json.dumps(page_json(page), ensure_ascii=False).encode())])
            cats = [b["category"] for b in page.get("boxes", [])]
            classes.update(cats)
            pages_with.update(set(cats))
            sources[page.get("source", "?")] += 1
            docs.add(page.get("doc_id", pid))
            n_spans += len(page["spans"])
    finally:
        files.close()
    skipped = list(skips or []) + list(local_skips)
    manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "pages": sum(s["pages"] for s in files.shards), "documents": len(docs), "spans": n_spans,
                "shards": files.shards, "boxes_per_class": dict(classes), "pages_with_class": dict(pages_with),
                "sources": dict(sources), "skipped_count": len(skipped),
                "skip_reasons": dict(Counter(reason_key(s["reason"]) for s in skipped)), "skipped": skipped}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
    return manifest
