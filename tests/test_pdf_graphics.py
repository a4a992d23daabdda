"""The PDF builder's Table and Picture rules on drawn pages: boxes ruled around text are text, a ruled
grid of columns is a table, a sketch with dashes and diagonals is a picture."""
from __future__ import annotations

import pymupdf

from gsdistill.tuples.pdf import page_regions
from gsdistill.tuples.pdf_layout_graphics import _columns_inside


def _box(page, rect, width=0.4):
    """A frame drawn as four separate strokes, as LaTeX's \\fbox and l3doc's function boxes draw it."""
    x0, y0, x1, y1 = rect
    for a, b in (((x0, y0), (x1, y0)), ((x0, y1), (x1, y1)), ((x0, y0), (x0, y1)), ((x1, y0), (x1, y1))):
        page.draw_line(a, b, width=width)


def _categories(page) -> list[tuple[str, str]]:
    return [(r["category"], r["text"]) for r in page_regions(page)]


def test_one_line_ruled_signature_box_is_text_not_table():
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    page.insert_text((80, 100), "Some body text before the macro.", fontsize=10)
    _box(page, (126, 112, 330, 126))
    # the signature as separate pieces with word spaces between them (3-4 pt), as LaTeX sets it
    for x, word in ((132, "\\kv@normalize"), (210, "{key"), (236, "value"), (266, "list}")):
        page.insert_text((x, 122), word, fontsize=10)
    page.insert_textbox(pymupdf.Rect(80, 140, 520, 200), "Text that explains the macro above. " * 4, fontsize=10)
    cats = _categories(page)
    assert not any(c in ("Table", "Picture") for c, _ in cats), cats
    assert any(c == "Text" and "kv@normalize" in t for c, t in cats), cats


def test_box_ruled_around_text_lines_is_text_not_picture():
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    _box(page, (140, 300, 520, 420))
    for i, line in enumerate(["\\begin{function}{\\package_function:N}", "\\begin{syntax}", "\\cs{package_function:N}",
                              "\\end{syntax}", "\\end{function}"]):
        page.insert_text((150, 318 + 20 * i), line, fontsize=9)
    page.draw_line((160, 405), (300, 405), width=0.8)  # an underline inside the box: still only rules
    cats = _categories(page)
    assert not any(c in ("Table", "Picture") for c, _ in cats), cats
    assert any("package_function" in t for _, t in cats)


def test_sketch_with_dashes_and_a_diagonal_stays_a_picture():
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    _box(page, (150, 300, 400, 500))
    for x in range(160, 390, 4):  # a dashed guide line of 1.5 pt dashes
        page.draw_line((x, 450), (x + 1.5, 450), width=0.4)
    page.draw_line((160, 310), (390, 490), width=0.4)
    page.insert_text((200, 380), "Textbody", fontsize=9)
    cats = _categories(page)
    assert [c for c, _ in cats if c in ("Table", "Picture")] == ["Picture"], cats


def test_ruled_grid_of_columns_is_a_table_and_one_row_is_not(draw_ruled_table):
    def lines_at(rows):
        return [{"bbox": (x, y, x + 40, y + 10), "spans": [{"bbox": (x, y, x + 40, y + 10), "text": "cell"}]}
                for y, xs in rows for x in xs]
    region = (0, 0, 400, 200)
    two_rows = lines_at([(20, (10, 200)), (40, (10, 200))])
    assert _columns_inside(region, two_rows)
    # one row of three far-apart pieces once counted as two "rows" (each piece with a far neighbour)
    assert not _columns_inside(region, lines_at([(20, (10, 100, 200))]))
    # word spaces (4 pt) on two rows are not columns
    words = lines_at([(20, (10, 54, 98)), (40, (10, 54, 98))])
    assert not _columns_inside(region, words)
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    draw_ruled_table(page)
    assert [c for c, _ in _categories(page) if c in ("Table", "Picture")] == ["Table"]
