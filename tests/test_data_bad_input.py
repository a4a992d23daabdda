"""Bad input never vanishes: each builder, fed a folder of good and bad files, keeps every good page
and reports every bad file / page / box in the manifest with its reason."""
from __future__ import annotations

import json

import numpy as np
import pymupdf
import pytest
from PIL import Image

from gsdistill.config import load_config
from gsdistill.tuples.builder import inputs as build_inputs
from gsdistill.tuples.builder.driver import build_shards
from gsdistill.tuples.sources.images import to_rgb
from gsdistill.tuples.store.reader import read_pages



def zero_page_pdf() -> bytes:
    """A well-formed PDF (with its xref table) whose page tree is empty."""
    objs = [b"<</Type/Catalog/Pages 2 0 R>>", b"<</Type/Pages/Kids[]/Count 0>>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<</Size %d/Root 1 0 R>>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def truncated_pdf(extra: int) -> bytes:
    """A 3-page PDF cut near its page tree: at ``extra`` = 0 MuPDF repairs the xref and finds no
    page, at 20 it cannot open the rest."""
    doc = pymupdf.open()
    for _ in range(3):
        doc.new_page().insert_text((72, 72), "hello world " * 20)
    data = doc.tobytes(garbage=0, deflate=False)
    return data[: data.index(b"2 0 obj") + extra]


def fake_ocr(image):
    """One word per non-blank image; its text is the image's mean red value (checks conversions)."""
    arr = np.asarray(image)
    if arr.min() == arr.max():
        return []
    return [{"text": f"mean{int(arr[..., 0].mean())}", "bbox": [2, 2, 30, 12], "group": 0}]


def text_pdf(path, pages=1, size=(612, 792), blank=()):
    doc = pymupdf.open()
    for i in range(pages):
        page = doc.new_page(width=size[0], height=size[1])
        if i not in blank:
            page.insert_text((72, 144), f"Body text of page {i} with some words.", fontsize=10)
    doc.save(path)


def reasons(manifest: dict) -> dict[str, str]:
    return {item["source"].split("/")[-1]: item["reason"] for item in manifest["skipped"]}


def cfg(*overrides):
    return load_config("tuples", None, ["build.progress=false", *overrides])


def test_pdf_folder_keeps_good_pages_and_reports_bad_ones(tmp_path):
    src = tmp_path / "pdfs"
    src.mkdir()
    text_pdf(src / "good.pdf", pages=2)
    (src / "corrupt.pdf").write_bytes(b"%PDF-1.4 this is not a pdf body" * 20)
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "secret")
    doc.save(src / "encrypted.pdf", encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="u", owner_pw="o")
    (src / "zero.pdf").write_bytes(zero_page_pdf())
    (src / "truncated.pdf").write_bytes(truncated_pdf(0))
    (src / "cut.pdf").write_bytes(truncated_pdf(20))
    text_pdf(src / "toolong.pdf", pages=4)
    text_pdf(src / "blank.pdf", pages=2, blank=(1,))
    doc = pymupdf.open()  # one normal page, one poster-size page
    doc.new_page().insert_text((72, 72), "normal page")
    doc.new_page(width=6000, height=6000).insert_text((72, 72), "giant page")
    doc.save(src / "giant.pdf")
    (src / "notes.txt").write_text("not a pdf")

    out = tmp_path / "shards"
    manifest = build_shards("pdf", src, out, cfg("pdf.max_page_count=3"))
    ids = sorted(p["id"] for p in read_pages(out))
    assert ids == ["blank.pdf-p0001", "giant.pdf-p0001", "good.pdf-p0001", "good.pdf-p0002"]
    r = reasons(manifest)
    assert r["corrupt.pdf"].startswith("unreadable PDF")
    assert r["encrypted.pdf"].startswith("encrypted PDF")
    assert r["zero.pdf"].startswith("PDF has zero pages") and "pdf.ocr_empty_pages=true" in r["blank.pdf#page=2"]
    assert r["truncated.pdf"].startswith("damaged PDF") and r["cut.pdf"].startswith("damaged PDF")
    assert r["toolong.pdf"].startswith("huge PDF: 4 pages")
    assert r["blank.pdf#page=2"].startswith("no text")
    assert r["giant.pdf#page=2"].startswith("huge page")
    assert r["notes.txt"].startswith("unsupported file type")
    assert manifest["skipped_count"] == 9 and (out / "skipped.csv").read_text().count("\n") == 10
    assert manifest["skip_reasons"]["unreadable PDF"] == 1 and manifest["skip_reasons"]["damaged PDF"] == 2


def test_image_folder_converts_modes_and_reports_unreadable(tmp_path, monkeypatch):
    monkeypatch.setattr(build_inputs, "ocr_function", lambda c: fake_ocr)
    src = tmp_path / "scans"
    src.mkdir()
    ramp = np.tile(np.linspace(0, 1, 64), (48, 1))
    Image.fromarray((ramp * 255).astype(np.uint8), "L").save(src / "gray.png")
    Image.fromarray((ramp * 65535).astype(np.uint16)).save(src / "deep16.png")   # 16-bit grayscale PNG
    cmyk = np.zeros((48, 64, 4), np.uint8)
    cmyk[..., 0] = (ramp * 255).astype(np.uint8)  # cyan ramp -> red falls from 255 to 0
    Image.fromarray(cmyk, "CMYK").save(src / "print.jpg", quality=95)
    rgba = np.zeros((48, 64, 4), np.uint8)
    rgba[..., 3] = (ramp * 255).astype(np.uint8)   # black, fading in over white
    Image.fromarray(rgba, "RGBA").save(src / "alpha.png")
    Image.new("RGB", (64, 48), "white").save(src / "empty.png")
    (src / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    out = tmp_path / "shards"
    manifest = build_shards("images", src, out, cfg())
    pages = {p["id"].rsplit(".", 1)[0]: p for p in read_pages(out)}
    assert sorted(p["id"] for p in pages.values()) == ["alpha.png", "deep16.png", "gray.png", "print.jpg"]
    assert all(p["image"].mode == "RGB" for p in pages.values())
    # the ramp's mean is 127.5 in every source; 16-bit and CMYK/alpha (inverted) must land there too
    for name in ("gray", "deep16", "print", "alpha"):
        assert abs(int(pages[name]["spans"][0]["text"][4:]) - 127) <= 3, name
    r = reasons(manifest)
    assert r["broken.png"].startswith("unreadable image")
    assert r["empty.png"].startswith("no text")
    assert manifest["skipped_count"] == 2


def test_to_rgb_scales_16_bit_and_float():
    deep = Image.fromarray(np.array([[0, 65535]], np.uint16))
    assert np.asarray(to_rgb(deep))[0, :, 0].tolist() == [0, 255]
    flt = Image.fromarray(np.array([[0.0, 0.5, 1.0]], np.float32), "F")
    assert np.asarray(to_rgb(flt))[0, :, 1].tolist() == [0, 128, 255]


def test_coco_missing_images_unknown_classes_and_boxes_outside(tmp_path, monkeypatch):
    monkeypatch.setattr(build_inputs, "ocr_function", lambda c: fake_ocr)
    root = tmp_path / "coco"
    (root / "images").mkdir(parents=True)
    for name in ("a.png", "b.png"):
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (100, 80, 3), np.uint8)).save(root / "images" / name)
    coco = {"images": [{"id": 1, "file_name": "a.png", "width": 80, "height": 100},
                       {"id": 2, "file_name": "b.png", "width": 80, "height": 100},
                       {"id": 3, "file_name": "gone.png", "width": 80, "height": 100}],
            "categories": [{"id": 1, "name": "text"}, {"id": 2, "name": "figure"}, {"id": 9, "name": "stamp"}],
            "annotations": [
                {"id": 10, "image_id": 1, "category_id": 1, "bbox": [0, 0, 40, 20]},
                {"id": 11, "image_id": 1, "category_id": 9, "bbox": [0, 30, 40, 20]},    # unknown class
                {"id": 12, "image_id": 1, "category_id": 2, "bbox": [60, 80, 50, 50]},   # partly outside: clipped
                {"id": 13, "image_id": 2, "category_id": 1, "bbox": [200, 300, 10, 10]},  # wholly outside
                {"id": 14, "image_id": 2, "category_id": 1, "bbox": [5, 5, -3, 10]},      # negative width
                {"id": 15, "image_id": 2, "category_id": 2, "bbox": [10, 10, 30, 30]},
                {"id": 16, "image_id": 3, "category_id": 1, "bbox": [0, 0, 10, 10]},
                {"id": 17, "image_id": 99, "category_id": 1, "bbox": [0, 0, 10, 10]}]}   # unknown image
    (root / "samples.json").write_text(json.dumps(coco))
    out = tmp_path / "shards"
    manifest = build_shards("coco", root, out, cfg())
    pages = {p["id"]: p for p in read_pages(out)}
    assert sorted(pages) == ["publaynet-a.png", "publaynet-b.png"]
    assert pages["publaynet-a.png"]["boxes"] == [{"category": "Text", "bbox": [0.0, 0.0, 40.0, 20.0]},
                                            {"category": "Picture", "bbox": [60.0, 80.0, 80.0, 100.0]}]
    assert pages["publaynet-b.png"]["boxes"] == [{"category": "Picture", "bbox": [10.0, 10.0, 40.0, 40.0]}]
    r = reasons(manifest)
    assert r["samples.json#gone.png"].startswith("missing image")
    assert r["samples.json#a.png#ann=11"] == "unknown class: 'stamp'"
    assert r["samples.json#a.png#ann=12"].startswith("box clipped to page")
    assert r["samples.json#b.png#ann=13"].startswith("box outside page")
    assert r["samples.json#b.png#ann=14"].startswith("negative box size")
    assert r["samples.json#ann=17"].startswith("unknown image_id: 99")
    assert manifest["skip_reasons"]["unknown image_id"] == 1 and manifest["skip_reasons"]["negative box size (dropped, not flipped)"] == 1


def test_coco_without_text_and_without_ocr_is_recorded(tmp_path):
    (tmp_path / "images").mkdir()
    Image.new("RGB", (50, 50), "gray").save(tmp_path / "images" / "p.png")
    coco = {"images": [{"id": 1, "file_name": "p.png", "width": 50, "height": 50}],
            "categories": [{"id": 1, "name": "text"}], "annotations": []}
    (tmp_path / "t.json").write_text(json.dumps(coco))
    manifest = build_shards("coco", tmp_path / "t.json", tmp_path / "out", cfg("ocr.enabled=false"))
    assert manifest["pages"] == 0 and reasons(manifest)["t.json#p.png"].startswith("no text")


def test_docbank_empty_malformed_and_imageless_files(tmp_path):
    good = "Hello\t100\t100\t200\t120\t0\t0\t0\tCMR10\tparagraph\r\nworld\t210\t100\t300\t120\t0\t0\t0\tCMR10\tparagraph\r\n"
    (tmp_path / "images").mkdir()
    (tmp_path / "ann").mkdir()
    for stem in ("paper_0", "empty_0", "junk_0"):
        Image.new("RGB", (100, 130), "white").save(tmp_path / "images" / f"{stem}_ori.jpg")
        (tmp_path / "ann" / f"{stem}.txt").write_text({"paper_0": good, "empty_0": "", "junk_0": "a b c\nd\te\n"}[stem])
    (tmp_path / "ann" / "noimage_1.txt").write_text(good)
    manifest = build_shards("docbank", tmp_path, tmp_path / "out", cfg())
    pages = list(read_pages(tmp_path / "out"))
    assert [p["id"] for p in pages] == ["docbank-paper_0"]
    assert pages[0]["spans"][0]["text"] == "Hello world"
    assert pages[0]["boxes"] == [{"category": "Text", "bbox": [10.0, 13.0, 30.0, 15.6]}]
    r = reasons(manifest)
    assert r["empty_0.txt"] == "empty annotation file"
    assert r["junk_0.txt"].startswith("no valid token line")
    assert r["noimage_1.txt"].startswith("missing image")


def test_missing_input_is_a_clear_error(tmp_path):
    from gsdistill.tuples.errors import DataError
    with pytest.raises(DataError, match="no such file or folder"):
        build_shards("pdf", tmp_path / "absent", tmp_path / "out", cfg())
