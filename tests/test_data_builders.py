"""Builders against known ground truth: a PDF drawn with one example of every class, the real
PubLayNet / DocBank / arXiv samples (``shared_data``), texlive's PDFs and Tesseract where present."""
from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path

import pymupdf
import pytest
from PIL import Image, ImageDraw

from gsdistill.tuples.sources.coco import coco_pages, spans_by_box
from gsdistill.tuples.sources.docbank import docbank_pages, group_tokens, parse_tokens
from gsdistill.tuples.errors import SkipLog
from gsdistill.tuples.sources.images import image_pages, tesseract_available, tesseract_ocr
from gsdistill.tuples.labels import DOCLAYNET_CLASSES
from gsdistill.tuples.sources.pdf import pdf_pages

TEXLIVE = Path("/usr/share/doc/texlive-doc")
BODY = ("Documents mix text with pictures and tables. " * 6).strip()


def layout_pdf(path: Path) -> None:
    """Page 1 holds one example of every DocLayNet class at known places; page 2 plain text."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((250, 40), "Journal of Tests 2026", fontsize=8)
    page.insert_text((150, 110), "A Study of Page Layouts", fontsize=22, fontname="hebo")
    page.insert_text((72, 160), "1 Introduction", fontsize=13, fontname="hebo")
    page.insert_textbox(pymupdf.Rect(72, 170, 540, 230), BODY, fontsize=10)
    page.insert_textbox(pymupdf.Rect(72, 238, 540, 258), "1. first point of the list", fontsize=10)
    page.insert_textbox(pymupdf.Rect(72, 256, 540, 276), "2. second point of the list", fontsize=10)
    page.insert_text((250, 300), "a b c d e f g h", fontsize=11, fontname="symb")  # Symbol = a math font
    buf = io.BytesIO()
    Image.radial_gradient("L").convert("RGB").save(buf, format="PNG")
    page.insert_image(pymupdf.Rect(200, 320, 400, 470), stream=buf.getvalue())
    page.insert_text((200, 490), "Figure 1: A gradient picture.", fontsize=9)
    for ry in (520, 538, 592):  # booktabs-like rules around a two-column table
        page.draw_line((150, ry), (460, ry), width=0.6)
    for i, (a, b) in enumerate([("Name", "Value"), ("alpha", "1.0"), ("beta", "2.0"), ("gamma", "3.0")]):
        page.insert_text((160, 533 + i * 18), a, fontsize=10)
        page.insert_text((380, 533 + i * 18), b, fontsize=10)
    page.insert_text((72, 700), "1 A footnote that explains a detail of the text.", fontsize=7)
    page.insert_text((300, 760), "1", fontsize=9)
    doc.new_page(width=612, height=792).insert_textbox(pymupdf.Rect(72, 100, 540, 160), BODY, fontsize=10)
    doc.save(path)


def test_pdf_builder_finds_every_class_in_reading_order(tmp_path):
    layout_pdf(tmp_path / "layout.pdf")
    pages = list(pdf_pages(tmp_path / "layout.pdf", dpi=144))
    assert [p["id"] for p in pages] == ["layout.pdf-p0001", "layout.pdf-p0002"]
    first = pages[0]
    assert (first["width"], first["height"]) == (1224, 1584) and first["image"].size == (1224, 1584)
    assert sorted({b["category"] for b in first["boxes"]}) == DOCLAYNET_CLASSES
    order = [s["category"] for s in first["spans"]]
    assert order == ["Page-header", "Title", "Section-header", "Text", "List-item", "List-item", "Formula",
                     "Caption", "Table", "Footnote", "Page-footer"]
    table = next(s for s in first["spans"] if s["category"] == "Table")
    assert table["text"] == "Name Value alpha 1.0 beta 2.0 gamma 3.0" and table["bbox"] == [300, 1040, 920, 1184]
    picture = next(b for b in first["boxes"] if b["category"] == "Picture")
    # the square image is centred in its (200,320)-(400,470) pt rect: (225,320)-(375,470) pt x 2
    assert picture["bbox"] == [450, 640, 750, 940]
    # pixel box = PDF points * dpi / 72
    title = pymupdf.open(tmp_path / "layout.pdf")[0].search_for("A Study of Page Layouts")[0]
    got = next(s["bbox"] for s in first["spans"] if s["category"] == "Title")
    assert got == pytest.approx([title.x0 * 2, title.y0 * 2, title.x1 * 2, title.y1 * 2], abs=1.0)
    assert pages[1]["spans"][0]["text"] == BODY and pages[1]["boxes"][0]["category"] == "Text"


def test_pdf_rotated_page_boxes_follow_the_render(tmp_path):
    doc = pymupdf.open()
    page = doc.new_page(width=600, height=300)
    page.insert_text((50, 100), "rotated words here", fontsize=12)
    page.set_rotation(90)
    doc.save(tmp_path / "rot.pdf")
    (p,) = pdf_pages(tmp_path / "rot.pdf", dpi=72)
    assert p["image"].size == (300, 600)
    x0, y0, x1, y1 = p["spans"][0]["bbox"]
    assert 0 <= x0 < x1 <= 300 and 0 <= y0 < y1 <= 600 and (y1 - y0) > (x1 - x0)  # text now runs down the page


@pytest.mark.skipif(not TEXLIVE.is_dir(), reason="texlive docs absent (Debian texlive-latex-base-doc)")
def test_texlive_guide_pages():
    path = TEXLIVE / "latex" / "base" / "clsguide.pdf"
    if not path.is_file():
        pytest.skip(f"{path} absent")
    pages = list(pdf_pages(path, dpi=72, max_pages=4))
    assert len(pages) == 4
    cats = Counter(b["category"] for p in pages for b in p["boxes"])
    assert cats["Title"] == 1 and cats["Section-header"] >= 3 and cats["Text"] >= 10
    page4 = {s["category"]: s["text"] for s in pages[3]["spans"]}
    assert page4["Page-footer"] == "4" and "List-item" in page4
    for p in pages:
        assert all(0 <= b["bbox"][0] < b["bbox"][2] <= p["width"] and 0 <= b["bbox"][1] < b["bbox"][3] <= p["height"]
                   for b in p["boxes"])


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]{3,}", text)


def test_arxiv_pdf_text_matches_docbank_tokens(shared_data):
    pdf = shared_data / "arxiv_pdfs_docbank" / "246.tar_1808.08720.gz_conll2018_black.pdf"
    skips = SkipLog()
    pages = list(pdf_pages(pdf, dpi=72, skips=skips))
    assert len(pages) == 10 and len(skips) == 0 and {p["doc_id"] for p in pages} == {pdf.name}
    first = {b["category"] for b in pages[0]["boxes"]}
    assert {"Title", "Section-header", "Text", "Footnote"} <= first
    tokens, _, _ = parse_tokens(shared_data / "docbank_samples" / "annotations" / "246.tar_1808.08720.gz_conll2018_3.txt")
    truth = Counter(w for t in tokens if t["label"] == "paragraph" for w in _words(t["text"]))
    ours = Counter(w for s in pages[3]["spans"] for w in _words(s["text"]))
    found = sum(min(n, ours[w]) for w, n in truth.items()) / sum(truth.values())
    assert found >= 0.95, found


def fake_ocr_at_box_centres(boxes_by_size):
    """A word at the centre of every annotated box of every page of the image's size."""
    def ocr(image):
        return [{"text": f"w{i}", "bbox": [cx - 1, cy - 1, cx + 1, cy + 1], "group": i}
                for i, (cx, cy) in enumerate(boxes_by_size.get(image.size, []))]
    return ocr


def test_publaynet_examples_counts(shared_data):
    root = shared_data / "publaynet_examples"
    coco = json.loads((root / "samples.json").read_text())
    centres: dict = {}
    sizes = {im["id"]: (im["width"], im["height"]) for im in coco["images"]}
    for a in coco["annotations"]:
        x, y, w, h = a["bbox"]
        centres.setdefault(sizes[a["image_id"]], []).append((x + w / 2, y + h / 2))
    skips = SkipLog()
    pages = list(coco_pages(root / "samples.json", ocr_fn=fake_ocr_at_box_centres(centres), skips=skips))
    assert len(pages) == 20 and sum(len(p["boxes"]) for p in pages) == 193 and len(skips) == 0
    assert Counter(b["category"] for p in pages for b in p["boxes"]) == {
        "Text": 137, "Section-header": 34, "Picture": 9, "List-item": 7, "Table": 6}
    assert all(p["doc_id"].startswith("PMC") and p["source"] == "publaynet" for p in pages)
    # the word at each box's centre becomes that box's span (same box, same class)
    for p in pages:
        spans = {(tuple(s["bbox"]), s["category"]) for s in p["spans"]}
        assert all((tuple(b["bbox"]), b["category"]) in spans for b in p["boxes"]), p["id"]
    no_text = SkipLog()
    assert list(coco_pages(root / "samples.json", skips=no_text)) == [] and len(no_text) == 20


def test_doclaynet_layout_uses_text_cells(tmp_path):
    for d in ("COCO", "PNG", "JSON"):
        (tmp_path / d).mkdir()
    Image.new("RGB", (200, 100), "white").save(tmp_path / "PNG" / "abc.png")
    coco = {"images": [{"id": 7, "file_name": "abc.png", "width": 200, "height": 100, "doc_name": "report.pdf", "page_no": 3}],
            "categories": [{"id": i + 1, "name": n} for i, n in enumerate(DOCLAYNET_CLASSES)],
            "annotations": [{"id": 1, "image_id": 7, "category_id": 11, "bbox": [10, 5, 180, 20]},
                            {"id": 2, "image_id": 7, "category_id": 10, "bbox": [10, 40, 180, 50]}]}
    (tmp_path / "COCO" / "val.json").write_text(json.dumps(coco))
    cells = {"cells": [{"bbox": [20, 10, 50, 10], "text": "Annual"}, {"bbox": [80, 10, 50, 10], "text": "Report"},
                       {"bbox": [20, 50, 100, 10], "text": "Revenue grew."}, {"bbox": [20, 95, 30, 4], "text": "stray"}]}
    (tmp_path / "JSON" / "abc.json").write_text(json.dumps(cells))
    (page,) = coco_pages(tmp_path / "COCO" / "val.json")
    assert page["source"] == "doclaynet" and page["doc_id"] == "report"
    assert page["spans"] == [{"text": "Annual Report", "bbox": [10.0, 5.0, 190.0, 25.0], "category": "Title"},
                             {"text": "Revenue grew.", "bbox": [10.0, 40.0, 190.0, 90.0], "category": "Text"},
                             {"text": "stray", "bbox": [20.0, 95.0, 50.0, 99.0], "category": None}]


def test_spans_by_box_prefers_the_innermost_box():
    boxes = [{"category": "Table", "bbox": [0, 0, 100, 100]}, {"category": "Caption", "bbox": [10, 10, 50, 20]}]
    pieces = [{"text": "cap", "bbox": [12, 12, 20, 18]}, {"text": "cell", "bbox": [60, 60, 70, 70]}]
    assert [(s["text"], s["category"]) for s in spans_by_box(pieces, boxes)] == [("cap", "Caption"), ("cell", "Table")]


def test_docbank_samples_keep_every_token(shared_data):
    root = shared_data / "docbank_samples"
    name = "246.tar_1808.08720.gz_conll2018_3"
    (page,) = docbank_pages(root / "annotations" / f"{name}.txt", images_dir=root / "images")
    assert page["doc_id"] == "1808.08720" and page["image"].size == (page["width"], page["height"])
    tokens, bad, _ = parse_tokens(root / "annotations" / f"{name}.txt")
    words = sorted(t["text"] for t in tokens if t["text"] and not t["text"].startswith("##LT"))
    assert bad == 0 and sorted(w for s in page["spans"] for w in s["text"].split()) == words
    assert {"Text", "Section-header", "Caption"} <= {b["category"] for b in page["boxes"]}
    # over all 100 pages (no image decoding): regions are far fewer than tokens, every label mapped
    n_tokens = n_regions = 0
    for txt in sorted((root / "annotations").glob("*.txt")):
        toks, _, _ = parse_tokens(txt)
        n_tokens, n_regions = n_tokens + len(toks), n_regions + len(group_tokens(toks))
    assert n_tokens == 61162 and 1000 < n_regions < n_tokens / 10


def test_image_pages_group_ocr_words_into_classed_paragraphs(tmp_path):
    Image.new("RGB", (400, 300), "white").save(tmp_path / "scan.png")
    words = [{"text": "Results", "bbox": [10, 10, 120, 40], "group": 1},
             {"text": "Body", "bbox": [10, 60, 60, 75], "group": 2, "line": 1},
             {"text": "text.", "bbox": [65, 60, 110, 75], "group": 2, "line": 1},
             {"text": "more", "bbox": [10, 80, 60, 95], "group": 2, "line": 2},
             {"text": "Figure", "bbox": [10, 200, 70, 215], "group": 3},
             {"text": "2:", "bbox": [75, 200, 90, 215], "group": 3},
             {"text": "plot.", "bbox": [95, 200, 140, 215], "group": 3}]
    (page,) = image_pages(tmp_path / "scan.png", ocr_fn=lambda im: [dict(w) for w in words])
    assert [(s["text"], s["category"]) for s in page["spans"]] == [
        ("Results", "Section-header"), ("Body text. more", "Text"), ("Figure 2: plot.", "Caption")]
    assert page["spans"][1]["bbox"] == [10.0, 60.0, 110.0, 95.0]


@pytest.mark.skipif(not tesseract_available(), reason="tesseract not installed (apt install tesseract-ocr)")
def test_tesseract_reads_rendered_words():
    img = Image.new("RGB", (520, 120), "white")
    try:
        from PIL import ImageFont
        font = ImageFont.truetype("DejaVuSans.ttf", 40)
    except OSError:
        pytest.skip("DejaVu font absent")
    ImageDraw.Draw(img).text((20, 30), "HELLO WORLD", font=font, fill="black")
    words = tesseract_ocr(img)
    assert [w["text"] for w in words] == ["HELLO", "WORLD"]
    assert 10 <= words[0]["bbox"][0] <= 30 and words[0]["bbox"][2] < words[1]["bbox"][0]


def test_reading_order_reads_left_column_before_right():
    from gsdistill.tuples.sources.pdf_layout_blocks import reading_order
    r = lambda name, cat, box: {"category": cat, "bbox": box, "text": name}  # noqa: E731
    regions = [r("R1", "Text", [320, 100, 540, 180]), r("foot", "Page-footer", [300, 760, 310, 770]),
               r("L2", "Text", [72, 200, 290, 300]), r("title", "Title", [72, 50, 540, 80]),
               r("L1", "Text", [72, 100, 290, 180]), r("R2", "Text", [320, 200, 540, 300]),
               r("note", "Footnote", [72, 700, 290, 720]), r("head", "Page-header", [250, 20, 350, 30])]
    assert [x["text"] for x in reading_order(regions, 612)] == ["head", "title", "L1", "L2", "R1", "R2", "note", "foot"]


def test_pdf_page_without_text_layer_is_ocred_when_asked(tmp_path):
    doc = pymupdf.open()
    page = doc.new_page(width=200, height=100)
    page.draw_rect(pymupdf.Rect(20, 20, 120, 40), fill=(0, 0, 0))  # "scanned" ink, no text
    doc.save(tmp_path / "scan.pdf")
    skips = SkipLog()
    assert list(pdf_pages(tmp_path / "scan.pdf", skips=skips)) == [] and "no text" in skips.items[0]["reason"]
    ocr = lambda im: [{"text": "inked", "bbox": [20, 20, 120, 40], "group": 0}]  # noqa: E731
    (p,) = pdf_pages(tmp_path / "scan.pdf", ocr_fn=ocr)
    assert p["id"] == "scan.pdf-p0001" and p["spans"] == [{"text": "inked", "bbox": [20.0, 20.0, 120.0, 40.0], "category": "Text"}]


@pytest.mark.slow
@pytest.mark.skipif(not tesseract_available(), reason="tesseract not installed (apt install tesseract-ocr)")
def test_tesseract_on_a_real_page_recovers_docbank_words(shared_data, tmp_path):
    name = "246.tar_1808.08720.gz_conll2018_3"
    (tmp_path / "scan.jpg").symlink_to(shared_data / "docbank_samples" / "images" / f"{name}_ori.jpg")
    (page,) = image_pages(tmp_path / "scan.jpg", ocr_fn=tesseract_ocr)
    tokens, _, _ = parse_tokens(shared_data / "docbank_samples" / "annotations" / f"{name}.txt")
    truth = Counter(w for t in tokens if t["label"] == "paragraph" for w in _words(t["text"]))
    ours = Counter(w for s in page["spans"] for w in _words(s["text"]))
    recall = sum(min(n, ours[w]) for w, n in truth.items()) / sum(truth.values())
    print(f"OCR word recall vs DocBank tokens: {recall:.3f}")
    assert recall >= 0.9
    assert {"Text", "Caption"} <= {b["category"] for b in page["boxes"]}  # "Table 2: ..." captions
