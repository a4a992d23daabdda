"""Page storage in shards (``gsdistill.tuples.store.image_codec``): ``zst`` is lossless and self-checking, every
format reads back the pixels written, formats mix in one folder, and a missing ``zstandard`` degrades to PNG."""
from __future__ import annotations

import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from gsdistill.tuples.store import image_codec
from gsdistill.tuples.store.image_codec import DamagedImage, decode_rgb, decode_zst, encode_image, image_kind
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.store.writer import write_shards
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.views.batched_views import page_rgb


def pages(n=3, seed=1):
    return list(generate_pages(n, seed=seed, width=200, height=240))


def test_every_format_round_trips_and_names_itself():
    page = pages(1)[0]["image"].convert("RGB")
    want = np.asarray(page)
    for fmt in ("zst", "png"):
        data = encode_image(page, fmt)
        assert image_kind(data) == fmt
        assert np.array_equal(decode_rgb(data), want)  # lossless: the very pixels
    jpg = encode_image(page, "jpg", jpeg_quality=95)
    assert image_kind(jpg) == "jpg" and np.abs(decode_rgb(jpg).astype(int) - want).mean() < 3
    assert image_kind(b"GIF89a") == "unknown"
    with pytest.raises(ValueError, match="zst | png | jpg"):
        encode_image(page, "gif")


def test_zst_is_smaller_than_png_on_pages():
    """The reason it is the default (docs/benchmarks.md, "Page storage"): fewer bytes on disk as well."""
    images = [p["image"] for p in pages(4)]
    assert sum(len(encode_image(im, "zst")) for im in images) < sum(len(encode_image(im, "png")) for im in images)


@pytest.mark.parametrize("damage", ["cut", "flip", "not_npy", "wrong_shape"])
def test_a_damaged_zst_page_is_named_not_read(damage):
    page = pages(1)[0]["image"]
    data = bytearray(encode_image(page, "zst"))
    zstd = pytest.importorskip("zstandard")
    if damage == "cut":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "not_npy":
        data = zstd.ZstdCompressor().compress(b"just bytes, no array header" * 8)
    else:
        import io
        buf = io.BytesIO()
        np.save(buf, np.zeros((4, 5), np.uint8))
        data = zstd.ZstdCompressor().compress(buf.getvalue())
    with pytest.raises(DamagedImage):
        decode_zst(bytes(data))


def test_a_folder_of_zst_and_png_shards_reads_the_same_pixels(tmp_path):
    """Readers tell formats apart by the bytes: shards written before a change of build.image_format still read;
    the CPU path (PIL) and the device path's worker side see the same page."""
    made = pages(4)
    write_shards(made[:2], tmp_path / "a", image_format="png", progress=False)
    write_shards(made[2:], tmp_path / "b", progress=False)  # the default: zst
    with tarfile.open(tmp_path / "b" / "shard-000000.tar") as tar:
        assert sorted({m.name.partition(".")[2] for m in tar}) == ["json", "zst"]
    read = [*read_pages(tmp_path / "a"), *read_pages(tmp_path / "b")]
    raw = [*read_pages(tmp_path / "a", decode_images=False), *read_pages(tmp_path / "b", decode_images=False)]
    for page, undecoded, source in zip(read, raw, made):
        want = np.asarray(source["image"].convert("RGB"))
        assert np.array_equal(np.asarray(page["image"].convert("RGB")), want)
        assert np.array_equal(page_rgb(undecoded), want)


def test_without_zstandard_pages_are_written_as_png_and_zst_pages_refused(monkeypatch, caplog):
    page = pages(1)[0]["image"]
    zst = encode_image(page, "zst")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # what a missing package looks like to an import
    monkeypatch.setattr(image_codec, "_warned_png", False)
    with caplog.at_level("WARNING", logger="gsdistill.tuples"):
        data = encode_image(page, "zst")
    assert [r.getMessage() for r in caplog.records] == [
        "zstandard is not installed: page images stored as PNG under .png names (lossless, 5-7x slower to read); "
        "pip install zstandard"]
    assert image_kind(data) == "png" and np.array_equal(decode_rgb(data), np.asarray(page.convert("RGB")))
    with pytest.raises(image_codec.ZstdUnavailable, match="needs the zstandard package.*pip install zstandard"):
        decode_rgb(zst)
