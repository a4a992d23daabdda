"""How a page image is stored in a shard: ``zst`` (the default), ``png`` or ``jpg``.

``zst`` is the page's raw ``uint8`` RGB pixels as an ``.npy`` array in one Zstandard frame (level 3,
with its content checksum): lossless like PNG, and on document pages both smaller and much faster to
read (``tools/bench/bench_data.py --views-cost``, docs/benchmarks.md "Page storage"; one core, median of 3):

=========================  ==========  ====================  ==========  ===============
pages                      PNG KB      PNG decode ms (PIL)   zst KB      zst decode ms
=========================  ==========  ====================  ==========  ===============
synthetic 512x640          44.0        1.58                  25.5        0.28
arXiv pages, 72 dpi        139.1       3.30                  82.0        0.50
arXiv pages, 144 dpi       381.3       11.21                 184.3       1.60
=========================  ==========  ====================  ==========  ===============

PNG pays for its per-row filters and Deflate's bit-level Huffman decoding; Zstandard's entropy stage
decodes bytes at a time, and the long runs of paper white that PNG's filters make small compress as
well under Zstandard's matcher. ``png`` stays for shards other tools read as images; ``jpg`` is lossy.

Readers tell the formats apart by their first bytes (:func:`image_kind`), never by the member's name, so a
folder may mix shards written before and after a change of ``build.image_format``, and shards of older
builds that stored PNG bytes under ``.zst`` names (a build without ``zstandard``) still read. Without a
working ``zstandard`` (missing, or broken: its ``libzstd`` absent) a build stores ``png`` members
(said in one line), and a ``zst`` page is refused as needing the package, never called damaged.
"""
from __future__ import annotations

import io
import logging
import sys

import numpy as np
from PIL import Image

from gsdistill.errors import GsdistillError

log = logging.getLogger("gsdistill.tuples")

FORMATS = ("zst", "png", "jpg")
ZSTD_LEVEL = 3  # level 9 saves 10-15 % more bytes at 4x the write time; reads are as fast
_ZSTD_MAGIC, _PNG_MAGIC, _JPEG_MAGIC = b"\x28\xb5\x2f\xfd", b"\x89PNG", b"\xff\xd8\xff"


class DamagedImage(ValueError):
    """The bytes are not a readable page image of their format (the message says why)."""


class ZstdUnavailable(GsdistillError, RuntimeError):
    """A ``zst`` page image met where ``zstandard`` is missing or broken: the shard is intact, this
    machine lacks the decoder (the message names the package and the fix)."""


_NOT_PROBED = object()
_zstd_state: list = [_NOT_PROBED, None, None]  # [sys.modules entry probed, module or None, why unusable]
_warned_png = False  # the PNG fallback is said once per process (forked build workers inherit this)


def _zstd():
    """The ``zstandard`` module, or None where it is missing or broken (a dependency; an image lacking
    it, such as the offline GPU machines', still writes PNG and reads PNG/JPEG shards). Broken: the
    import or its first use fails (``ImportError`` / ``OSError`` of a missing ``libzstd.so``, ...).
    Probed once per ``sys.modules`` entry (a replaced entry is probed again)."""
    entry = sys.modules.get("zstandard")
    if _zstd_state[0] is entry:
        return _zstd_state[1]
    try:
        import zstandard
        zstandard.ZstdDecompressor().decompress(zstandard.ZstdCompressor(write_checksum=True).compress(b"ok"))
        module, why = zstandard, None
    except ModuleNotFoundError:
        module, why = None, "zstandard is not installed"
    except Exception as e:  # ImportError, OSError, AttributeError of a half-installed package
        reason = " ".join(str(e).split())
        module, why = None, f"zstandard is installed but broken ({type(e).__name__}{': ' + reason if reason else ''})"
    _zstd_state[:] = [sys.modules.get("zstandard"), module, why]
    return module


def zstd_problem() -> str | None:
    """Why ``zst`` pages cannot be written or read here, in words; None when they can."""
    return None if _zstd() is not None else _zstd_state[2]


def _zstd_or_raise():
    if (zstd := _zstd()) is None:
        raise ZstdUnavailable(f"a zst page image needs the zstandard package, but {zstd_problem()}: "
                              "pip install zstandard (or rebuild the shards with build.image_format=png)")
    return zstd


def stored_format(fmt: str) -> str:
    """The format pages asked to be ``fmt`` are stored in here: ``png`` for ``zst`` without a working
    ``zstandard`` (said once per process, one line), else ``fmt``."""
    global _warned_png
    if fmt != "zst" or _zstd() is not None:
        return fmt
    if not _warned_png:
        _warned_png = True
        log.warning("%s: page images stored as PNG under .png names (lossless, 5-7x slower to read); "
                    "pip install zstandard", zstd_problem())
    return "png"


def encode_image(image: Image.Image, fmt: str, jpeg_quality: int = 90) -> bytes:
    """The stored bytes of a page image (``fmt`` one of :data:`FORMATS`; ``zst`` without a working
    ``zstandard`` gives PNG: name the member by :func:`image_kind` of the bytes, never by ``fmt``)."""
    if fmt not in FORMATS:
        raise ValueError(f"image_format must be one of {' | '.join(FORMATS)}, got {fmt!r}")
    fmt = stored_format(fmt)
    rgb = image.convert("RGB")
    if fmt == "zst":
        buf = io.BytesIO()
        np.save(buf, np.asarray(rgb), allow_pickle=False)
        return _zstd_or_raise().ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(buf.getvalue())
    buf = io.BytesIO()
    if fmt == "png":
        rgb.save(buf, format="PNG", compress_level=1)  # fast: shards are written often, read more
    else:
        rgb.save(buf, format="JPEG", quality=jpeg_quality)
    return buf.getvalue()


def image_kind(data: bytes | memoryview) -> str:
    """``zst``, ``png``, ``jpg`` or ``unknown``, from the first bytes."""
    head = bytes(data[:4])
    if head == _ZSTD_MAGIC:
        return "zst"
    if head == _PNG_MAGIC:
        return "png"
    return "jpg" if head[:3] == _JPEG_MAGIC else "unknown"


def decode_zst(data: bytes | memoryview) -> np.ndarray:
    """``uint8 [H, W, 3]`` RGB pixels of a ``zst`` page; checksum and array header checked."""
    zstd = _zstd_or_raise()
    try:
        raw = zstd.ZstdDecompressor().decompress(data)
    except zstd.ZstdError as e:  # cut, overwritten or checksum mismatch
        raise DamagedImage(f"Zstandard frame unreadable ({e})") from None
    head = io.BytesIO(raw[:256])
    try:
        version = np.lib.format.read_magic(head)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(head)
    except ValueError as e:
        raise DamagedImage(f"not an .npy page array ({e})") from None
    if dtype != np.uint8 or fortran or len(shape) != 3 or shape[2] != 3:
        raise DamagedImage(f"a {dtype} array of shape {shape}, not uint8 [H, W, 3] pixels")
    offset = head.tell()
    if len(raw) != offset + shape[0] * shape[1] * 3:
        raise DamagedImage(f"{len(raw) - offset} pixel bytes for a {shape[1]}x{shape[0]} page")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(shape)


def decode_rgb(data: bytes | memoryview) -> np.ndarray:
    """``uint8 [H, W, 3]`` RGB pixels of stored page bytes of any format (read-only for ``zst``)."""
    if image_kind(data) == "zst":
        return decode_zst(data)
    try:
        image = Image.open(io.BytesIO(bytes(data)))
        image.load()
    except Exception as e:  # OSError, SyntaxError ("broken PNG file"), DecompressionBombError, ...
        raise DamagedImage(f"{type(e).__name__}: {e}") from None
    return np.asarray(image.convert("RGB"))
