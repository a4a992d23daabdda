"""Born-digital PDFs -> page tuples with pymupdf.

Each page is rendered at ``dpi`` (pixel box = PDF points x dpi / 72, after the page's rotation),
its text blocks become spans in reading order, and layout regions in DocLayNet's classes are
inferred from fonts, sizes, positions, image blocks and vector drawings. The rules are listed in
``gsdistill.tuples.sources.pdf_layout`` (classes of text blocks), ``pdf_layout_blocks`` (splitting, line
numbers, margins, footnotes, double spacing, sub-figure captions) and ``pdf_layout_graphics``
(tables, pictures); one documented function per decision.

Bad input: an unreadable/corrupt file, a damaged one (truncated: MuPDF repairs it to zero pages), an
encrypted one, one with zero pages or more than
``max_page_count`` pages raises ``DataError`` naming the file (the folder driver records it). A page
larger than ``max_page_side_pt`` or whose render would exceed ``max_pixels``, a page pymupdf fails
on, a page with no text layer (unless ``ocr_fn`` is given: then it is OCRed like a scan) and a page
so small that its text boxes render under a pixel ("tiny page") are recorded in ``skips`` and not
yielded.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pymupdf
from PIL import Image

from gsdistill.tuples.sources import pdf_layout as L
from gsdistill.tuples.sources import pdf_layout_blocks as B
from gsdistill.tuples.sources import pdf_layout_graphics as G
from gsdistill.tuples.errors import DataError, SkipLog, ensure_log

pymupdf.TOOLS.mupdf_display_errors(False)  # MuPDF's own stderr chatter; failures surface as skips instead
_TEXT_FLAGS = pymupdf.TEXTFLAGS_DICT & ~pymupdf.TEXT_PRESERVE_IMAGES  # no image bytes: 10x faster
MAX_DRAWINGS = 3000  # beyond this a page is one heavy vector figure; clustering it would be slow


def _truncated(path: Path) -> bool:
    """PDF objects without the ``%%EOF`` marker near the end: a file cut short (download, copy)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(65536)
            fh.seek(max(0, path.stat().st_size - 1024))
            tail = fh.read()
    except OSError:
        return False
    return head.startswith(b"%PDF-") and b" obj" in head and b"%%EOF" not in tail


def open_pdf(path: str | Path, max_page_count: int = 5000) -> pymupdf.Document:
    """Open ``path`` or raise ``DataError`` (corrupt, encrypted, zero pages, too many pages)."""
    path = Path(path)
    try:
        doc = pymupdf.open(path)
    except Exception as e:  # pymupdf raises FileDataError, RuntimeError, ValueError for bad files
        kind = "damaged PDF: truncated (no %%EOF at its end)" if _truncated(path) else "unreadable PDF"
        raise DataError(f"{path}: {kind} ({type(e).__name__}: {e})") from None
    if not doc.is_pdf:
        doc.close()
        raise DataError(f"{path}: not a PDF")
    if doc.needs_pass:
        doc.close()
        raise DataError(f"{path}: encrypted PDF (needs a password)")
    n = doc.page_count
    if n == 0:
        repaired = doc.is_repaired  # MuPDF rebuilt a broken xref (truncated file) and found no page
        doc.close()
        raise DataError(f"{path}: " + ("damaged PDF: truncated or corrupt, MuPDF recovered no page"
                                       if repaired or _truncated(path) else "PDF has zero pages"))
    if n > max_page_count:
        doc.close()
        raise DataError(f"{path}: huge PDF: {n} pages > max_page_count {max_page_count}")
    return doc


def render(page: pymupdf.Page, dpi: int) -> Image.Image:
    pix = page.get_pixmap(dpi=dpi, alpha=False, colorspace=pymupdf.csRGB)
    return Image.frombytes("RGB", (pix.width, pix.height), pix.samples)


def page_regions(page: pymupdf.Page) -> list[dict]:
    """Layout regions ``{category, bbox (points), text}`` of one page, in reading order."""
    w, h = page.rect.width, page.rect.height
    data = page.get_text("dict", flags=_TEXT_FLAGS, sort=False)
    blocks = [B.make_block(lines) for b in data["blocks"] if b.get("type", 0) == 0
              for lines in [L.text_lines(b)] if lines]
    blocks = B.drop_line_numbers(blocks, h)
    all_lines = [ln for b in blocks for ln in b["lines"]]
    drawings = page.get_drawings()
    images = [list(info["bbox"]) for info in page.get_image_info()]
    tables = G.find_tables(drawings, all_lines, h)
    if len(drawings) > MAX_DRAWINGS:
        clusters = [L.union_box(d["rect"] for d in drawings)]
    else:
        clusters = [list(r) for r in page.cluster_drawings(drawings=drawings)] if drawings else []
    tables = G.find_drawn_tables(drawings, clusters, all_lines, tables, w * h)
    pictures = G.find_pictures(images, drawings, clusters, all_lines, w, h, tables)
    pictures = [p for p in pictures if not any(L.centre_inside(p, t) for t in tables)]
    body = L.body_size(blocks)
    blocks = B.split_by_style(blocks, body)
    largest = max((b["stats"]["size"] for b in blocks), default=0.0)
    free = [b for b in blocks if not any(L.centre_inside(b["bbox"], r) for r in tables + pictures)]
    B.mark_margins(free, body, h)
    B.mark_list_runs(free, body)
    L.mark_common_sizes(free)
    body_blocks = [b for b in free if not b.get("margin")]
    if body_blocks:
        min(body_blocks, key=lambda b: b["bbox"][1])["topmost"] = True
    absorbed = {id(t): [] for t in tables + pictures}
    regions = []
    for b in blocks:
        holder = next((r for r in tables + pictures if L.centre_inside(b["bbox"], r)), None)
        if holder is not None:
            absorbed[id(holder)].append(b["text"])
            continue
        b["largest"] = b["stats"]["size"] >= largest
        cat = L.classify_text(b, body, w, h, page.number == 0)
        groups = L.split_list_items(b["lines"]) if cat == "List-item" else [b["lines"]]
        for g in groups:
            regions.append({"category": cat, "bbox": L.union_box(ln["bbox"] for ln in g),
                            "text": " ".join(ln["text"] for ln in g), "size": b["stats"]["size"], "rows": L.st_rows(g)})
    regions = L.merge_formulas(regions, body)
    B.fix_footnotes(regions, body)
    B.extend_captions(regions, body)
    regions = B.merge_spaced_lines(B.merge_titles([r for r in regions if r["category"] is not None], body), body)
    for cat, rects in (("Table", tables), ("Picture", pictures)):
        for r in rects:
            regions.append({"category": cat, "bbox": list(r), "text": " ".join(absorbed[id(r)])})
    B.subfigure_captions(regions, body)
    return B.reading_order(regions, w)


def _to_pixels(page: pymupdf.Page, bbox, scale: float, size: tuple[int, int]) -> list[float] | None:
    r = (pymupdf.Rect(bbox) * page.rotation_matrix) * scale
    x0, y0 = max(0.0, min(r.x0, size[0])), max(0.0, min(r.y0, size[1]))
    x1, y1 = max(0.0, min(r.x1, size[0])), max(0.0, min(r.y1, size[1]))
    if x1 - x0 < 1 or y1 - y0 < 1:
        return None
    return [round(x0, 2), round(y0, 2), round(x1, 2), round(y1, 2)]


def pdf_pages(path: str | Path, dpi: int = 72, skips: SkipLog | None = None, max_page_count: int = 5000,
              max_page_side_pt: float = 5000.0, max_pixels: int = 60_000_000, max_pages: int | None = None,
              ocr_fn: Callable | None = None, doc_id: str | None = None, source: str = "pdf",
              first_page: int = 0) -> Iterator[dict]:
    """Page tuples of one PDF (see the module docstring for what is skipped and why).

    ``doc_id`` defaults to the file name (the folder driver passes the path relative to its root, so
    ids are unique by construction); page ids are ``<doc_id>-p<page number, 4 digits>``. Pages
    ``first_page`` (0-based) up to ``max_pages`` pages after it: a parallel build splits long PDFs.
    """
    path, skips = Path(path), ensure_log(skips)
    if dpi < 10 or dpi > 1200:
        raise ValueError(f"dpi must be in 10..1200, got {dpi}")
    doc = open_pdf(path, max_page_count)
    doc_id = doc_id or path.name
    scale = dpi / 72.0
    try:
        stop = doc.page_count if max_pages is None else min(first_page + max_pages, doc.page_count)
        for n in range(first_page, stop):
            where = f"{path}#page={n + 1}"
            try:
                page = doc[n]
                w, h = page.rect.width, page.rect.height
                if max(w, h) > max_page_side_pt:
                    skips.add(where, f"huge page: {w:.0f}x{h:.0f} pt > max_page_side_pt {max_page_side_pt:g}")
                    continue
                if w * h * scale * scale > max_pixels:
                    skips.add(where, f"huge page: render at {dpi} dpi > max_pixels {max_pixels}")
                    continue
                regions = page_regions(page)
                image = render(page, dpi)
            except Exception as e:  # a damaged page object: record it, keep the document's other pages
                skips.add(where, f"unreadable page: {type(e).__name__}: {e}")
                continue
            tuple_ = _assemble(page, regions, image, scale, f"{doc_id}-p{n + 1:04d}", doc_id, source)
            if not tuple_["spans"] and any(r["text"].strip() for r in regions):
                # it has a text layer: its boxes rendered under a pixel (a page of a few points)
                skips.add(where, f"tiny page: {w:.0f}x{h:.0f} pt renders to {image.width}x{image.height} px at "
                                 f"{dpi} dpi, its text boxes under a pixel; raise pdf.dpi (--dpi) to build it")
                continue
            if not tuple_["spans"] and ocr_fn is not None:
                from gsdistill.tuples.sources.images import ocr_page
                tuple_ = ocr_page(image, tuple_["id"], doc_id, source, ocr_fn)
            if not tuple_["spans"]:
                skips.add(where, "no text: page has no text layer (a scan? set pdf.ocr_empty_pages=true to OCR it)"
                          if ocr_fn is None else "no text: page has no text layer and OCR found none")
                continue
            yield tuple_
    finally:
        doc.close()


def _assemble(page, regions, image, scale, page_id, doc_id, source) -> dict:
    spans, boxes = [], []
    for r in regions:
        bbox = _to_pixels(page, r["bbox"], scale, image.size)
        if bbox is None:
            continue
        boxes.append({"category": r["category"], "bbox": bbox})
        if r["text"].strip():
            spans.append({"text": r["text"].strip(), "bbox": bbox, "category": r["category"]})
    return {"id": page_id, "image": image, "width": image.width, "height": image.height,
            "spans": spans, "boxes": boxes, "source": source, "doc_id": doc_id}
