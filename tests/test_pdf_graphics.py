"""The PDF builder's Table and Picture rules on drawn pages: boxes ruled around text are text, a ruled
grid of columns is a table, a sketch with dashes and diagonals is a picture."""
from __future__ import annotations

import pymupdf

from gsdistill.tuples.sources.pdf import page_regions
from gsdistill.tuples.sources.pdf_layout_graphics import _columns_inside


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


def _cells(page, x0, y0, rows, col_w=70, row_h=16, size=9):
    """Text of a grid, one piece a cell, its first baseline 11 pt under ``y0``."""
    for i, row in enumerate(rows):
        for j, text in enumerate(row):
            page.insert_text((x0 + 6 + j * col_w, y0 + 11 + i * row_h), text, fontsize=size)


def test_grid_ruled_in_per_cell_pieces_is_a_table():
    """hhline / longtable draw each rule as pieces one cell long, with vertical rules between the columns:
    no two horizontal rules have matching ends, so only the drawings' cluster finds it."""
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    x0, y0, cw, rh, rows = 150, 300, 70, 16, [("Name", "Size", "Kind"), ("alpha", "12", "box"), ("beta", "7", "rule")]
    for i in range(len(rows) + 1):
        for j in range(3):  # horizontal rule pieces, one a cell, each meeting the next
            page.draw_line((x0 + j * cw, y0 + i * rh), (x0 + (j + 1) * cw, y0 + i * rh), width=0.4)
    for j in range(4):
        for i in range(len(rows)):
            page.draw_line((x0 + j * cw, y0 + i * rh), (x0 + j * cw, y0 + (i + 1) * rh), width=0.4)
    _cells(page, x0, y0, rows, cw, rh)
    tables = [t for c, t in _categories(page) if c == "Table"]
    assert len(tables) == 1 and "alpha" in tables[0], _categories(page)


def test_coloured_cells_are_a_table():
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    x0, y0, rows = 150, 300, [("test", "row 1"), ("test", "row 2"), ("test", "row 3"), ("test", "row 4")]
    for i, colour in enumerate([(1, 1, 0), (0, 1, 0), (1, 1, 0), (0, 1, 0)]):
        page.draw_rect(pymupdf.Rect(x0, y0 + i * 16, x0 + 140, y0 + (i + 1) * 16), color=None, fill=colour)
    _cells(page, x0, y0, rows)
    assert [c for c, _ in _categories(page) if c in ("Table", "Picture")] == ["Table"], _categories(page)
    # a slide: a coloured background over the whole page and a box behind two columns of bullets is not a table
    slide = doc.new_page(width=842, height=595)
    slide.draw_rect(slide.rect, color=None, fill=(0.9, 0.9, 1))
    slide.draw_rect(pymupdf.Rect(100, 200, 700, 400), color=None, fill=(1, 1, 0.8))
    _cells(slide, 60, 40, [("Font embedding", "Encodings and CMaps")] * 8, col_w=380, row_h=60, size=28)
    assert "Table" not in [c for c, _ in _categories(slide)], _categories(slide)


def test_dashed_sketch_and_step_plot_with_labels_stay_pictures():
    """Axis-parallel drawings around two rows of far-apart labels, as a table has, but a sketch with dashed
    guides (geometry's page diagrams) and a plot's step curve (a path of many pieces) are pictures."""
    doc = pymupdf.open()
    page = doc.new_page(width=595, height=842)
    _box(page, (150, 100, 400, 300))
    for y in range(110, 290, 4):  # a dashed guide of 1.5 pt dashes
        page.draw_line((200, y), (200, y + 1.5), width=0.4)
    _cells(page, 160, 120, [("Kopf", "", "oben"), ("Breite", "", "unten")], col_w=100, row_h=140)
    steps = [(450, 400)] + [p for k in range(8) for p in ((450 + 15 * k, 420 + 20 * k), (465 + 15 * k, 420 + 20 * k))]
    page.draw_polyline(steps, width=0.8)
    page.draw_rect(pymupdf.Rect(440, 390, 580, 590), width=0.4)
    _cells(page, 440, 575, [("1", "", "20"), ("LF", "", "HF")], col_w=60, row_h=12)
    cats = [c for c, _ in _categories(page) if c in ("Table", "Picture")]
    assert cats == ["Picture", "Picture"], _categories(page)
