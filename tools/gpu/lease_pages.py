"""The real pages that travel to a lent GPU machine, and their way back into shards there.

Shards store each page as one Zstandard frame of its raw pixels (level 3, ~90 KB a 72 dpi texlive page).
Frames compressed one by one cannot share what pages share (the fonts' glyphs, the margins), so the
travel bundle holds the same shard tars with every ``.zst`` member replaced by its raw ``.npy`` bytes,
the whole bundle in one xz stream: 20 texlive pages took 1,335 KB as frames, 990 KB as frames at
level 19 and 589 KB as raw pixels in one xz stream. There, :func:`unpack_bundle` writes the shards again,
member for member (the page records unchanged, so the text cache's shard digests are those of here),
each page a level-3 frame again, or PNG where ``zstandard`` is absent.
"""
from __future__ import annotations

import io
import json
import lzma
import tarfile
from pathlib import Path

import numpy as np

SPLITS = ("train", "eval")
RAW = ".npy"  # a page's pixels in the bundle: the bytes its zst frame holds


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


def _recode_shard(data: bytes, page_bytes) -> bytes:
    """The shard tar ``data`` with each page image member passed through ``page_bytes(name, bytes) ->
    (name, bytes)``; every other member and the order unchanged."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src, tarfile.open(fileobj=out, mode="w:") as dst:
        for member in src:
            if member.isfile():
                name, body = page_bytes(member.name, src.extractfile(member).read())
                _add(dst, name, body)
    return out.getvalue()


def _to_raw(name: str, body: bytes) -> tuple[str, bytes]:
    import zstandard

    if name.endswith(".zst"):
        return name[:-4] + RAW, zstandard.ZstdDecompressor().decompress(body)
    return name, body


def pack_bundle(data_dir: Path, bundle: Path) -> dict:
    """``data_dir/{train,eval}`` (shards, manifests; not their text caches: the machine embeds in seconds)
    into ``bundle`` (tar.xz of raw-pixel shards); what went in."""
    counts = {}
    with lzma.open(bundle, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w|") as tar:
        for split in SPLITS:
            files = sorted(p for p in (data_dir / split).iterdir() if p.is_file())
            for f in files:
                body = f.read_bytes()
                _add(tar, f"{split}/{f.name}", _recode_shard(body, _to_raw) if f.suffix == ".tar" else body)
            counts[split] = json.loads((data_dir / split / "manifest.json").read_text())["pages"]
    return counts


def _from_raw(zstd):
    """Raw page bytes back to a stored image: a level-3 frame as the writer makes, or PNG without zstandard."""
    from gsdistill.tuples.store.image_codec import ZSTD_LEVEL, encode_image

    def recode(name: str, body: bytes) -> tuple[str, bytes]:
        if not name.endswith(RAW):
            return name, body
        if zstd is not None:
            return name[:-len(RAW)] + ".zst", zstd.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(body)
        from PIL import Image
        return name[:-len(RAW)] + ".png", encode_image(Image.fromarray(np.load(io.BytesIO(body))), "png")
    return recode


def unpack_bundle(bundle: Path, dest: Path) -> tuple[dict, str]:
    """``dest/{train,eval}`` shards from ``bundle``; (pages per split, the page codec written)."""
    try:
        import zstandard
    except ImportError:
        zstandard = None
    recode = _from_raw(zstandard)
    with lzma.open(bundle, "rb") as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            body = tar.extractfile(member).read()
            path = dest / member.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_recode_shard(body, recode) if path.suffix == ".tar" else body)
    pages = {s: json.loads((dest / s / "manifest.json").read_text())["pages"] for s in SPLITS}
    return pages, "zst" if zstandard is not None else "png"
