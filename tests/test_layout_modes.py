"""Each failure mode of the PDF layout heuristics (issue 13), reproduced by a small PDF made here."""
from __future__ import annotations

import io

import pymupdf
import pytest
from PIL import Image

from gsdistill.tuples.sources.pdf import page_regions

WORDS = ("the method of layout analysis reads every page of a document and finds its regions so that "
         "a model can learn where text tables and figures are placed").split()


def prose(n_words: int, start: int = 0) -> str:
    return " ".join(WORDS[(start + i) % len(WORDS)] for i in range(n_words))


def justified(start: int, chars: int = 64) -> str:
    """A line of about ``chars`` characters (lines of one paragraph end within a few points)."""
    return prose(40, start)[:chars].rstrip()


def lines(page, x: float, y: float, n: int, pitch: float = 12.0, size: float = 10, font: str = "helv",
          first_indent: float = 0.0) -> float:
    """``n`` full-width lines of prose from (x, y), one insert per line (as TeX output is); returns next y."""
    for i in range(n):
        page.insert_text((x + (first_indent if i == 0 else 0), y), justified(7 * i), fontsize=size, fontname=font)
        y += pitch
    return y


def regions(doc: pymupdf.Document, number: int = 0) -> list[dict]:
    return page_regions(doc[number])


def cats(regs, text_start: str) -> list[str]:
    return [r["category"] for r in regs if r["text"].startswith(text_start)]


def new_doc():
    doc = pymupdf.open()
    return doc, doc.new_page(width=612, height=792)


def test_heading_in_the_paragraphs_block_is_split_off():
    doc, page = new_doc()
    y = lines(page, 72, 100, 5)
    page.insert_text((72, y + 2), "2.1 Data Sets", fontsize=10, fontname="hebo")  # tight: pymupdf makes one block
    lines(page, 72, y + 14, 5)
    regs = regions(doc)
    assert cats(regs, "2.1 Data Sets") == ["Section-header"]
    assert sum(r["category"] == "Text" for r in regs) == 2


def test_numbered_heading_at_body_size_is_a_header_but_list_runs_stay_items():
    doc, page = new_doc()
    y = lines(page, 72, 100, 4)
    page.insert_text((72, y + 16), "6. Review", fontsize=10)
    y = lines(page, 72, y + 34, 4)
    page.insert_text((72, y + 14), "1. first point of the list", fontsize=10)
    page.insert_text((72, y + 28), "2. second point of the list", fontsize=10)
    regs = regions(doc)
    assert cats(regs, "6. Review") == ["Section-header"]
    assert cats(regs, "1. first") == ["List-item"] and cats(regs, "2. second") == ["List-item"]


def test_small_caps_heading_is_a_header():
    doc, page = new_doc()
    y = lines(page, 72, 100, 4)
    page.insert_text((200, y + 16), "IV. S", fontsize=10, fontname="tiro")
    page.insert_text((226, y + 16), "YSTEM MODEL", fontsize=8, fontname="tiro")
    lines(page, 72, y + 34, 4, font="tiro")
    assert cats(regions(doc), "IV. S") == ["Section-header"]


def test_author_lines_are_text_not_headers():
    doc, page = new_doc()
    page.insert_text((150, 80), "A Study of Page Layouts", fontsize=20, fontname="hebo")
    page.insert_text((180, 115), "Ada Lovelace, Alan Turing and Grace Hopper", fontsize=12)
    page.insert_text((72, 160), "1 Introduction", fontsize=12, fontname="hebo")
    lines(page, 72, 180, 8)
    regs = regions(doc)
    assert cats(regs, "Ada Lovelace") == ["Text"] and cats(regs, "1 Introduction") == ["Section-header"]
    assert cats(regs, "A Study") == ["Title"]


def test_bold_title_a_little_larger_than_body_is_the_title():
    doc, page = new_doc()
    page.insert_text((120, 48), "Fusion Cross Sections of Medium", fontsize=12, fontname="hebo")
    page.insert_text((120, 64), "and Heavy Nuclei", fontsize=12, fontname="hebo")  # a line apart: two blocks
    page.insert_text((230, 80), "Ada Lovelace and Alan Turing", fontsize=10)
    lines(page, 72, 110, 20)
    page.insert_text((72, 380), "I. INTRODUCTION", fontsize=11, fontname="hebo")
    regs = regions(doc)
    assert cats(regs, "Fusion Cross") == ["Title"] and cats(regs, "I. INTRODUCTION") == ["Section-header"]
    assert next(r for r in regs if r["category"] == "Title")["text"].endswith("and Heavy Nuclei")


def test_code_heavy_page_keeps_paragraphs_text():
    doc, page = new_doc()
    y = 90
    for block in range(3):  # the code font (8 pt) holds most characters; paragraphs are 2 lines at 10 pt
        y = lines(page, 72, y, 2, size=10) + 8
        for i in range(14):
            page.insert_text((72, y), f"    x{i} = compute(data[{i}], weight={i}) # step {block}", fontsize=8, fontname="cour")
            y += 10
        y += 10
    regs = regions(doc)
    paragraph = [r for r in regs if r["text"].startswith(WORDS[0])]
    assert paragraph and all(r["category"] == "Text" for r in paragraph)
    assert not any(r["category"] == "Section-header" for r in regs)


def _picture(page, rect):
    buf = io.BytesIO()
    Image.radial_gradient("L").convert("RGB").save(buf, format="PNG")
    page.insert_image(pymupdf.Rect(*rect), stream=buf.getvalue())


def test_caption_styles_and_subfigure_captions():
    doc, page = new_doc()
    page.insert_text((280, 70), "TABLE V", fontsize=8)
    page.insert_text((200, 80), "MANTISSAS OF THE BLOCK ALU", fontsize=8)
    y = lines(page, 72, 120, 4)
    _picture(page, (150, y + 10, 300, y + 130))
    page.insert_text((170, y + 145), "(a) left panel of the rig", fontsize=8)
    _picture(page, (320, y + 10, 470, y + 130))
    page.insert_text((340, y + 145), "(b) right panel of the rig", fontsize=8)
    page.insert_text((72, y + 165), "Fig. 1 Sketch of the test rig with both panels", fontsize=8)
    y = lines(page, 72, y + 195, 4)
    page.insert_text((72, y + 20), "Table B1: Constants of the appendix", fontsize=8)
    lines(page, 72, y + 45, 3)
    regs = regions(doc)
    for start in ("TABLE V", "(a) left", "(b) right", "Fig. 1 Sketch", "Table B1"):
        assert cats(regs, start) == ["Caption"], (start, [(r["category"], r["text"][:20]) for r in regs])


def test_stacked_footnotes_stay_footnotes():
    doc, page = new_doc()
    lines(page, 72, 100, 30)
    page.insert_text((72, 690), "1 The first note explains a detail of the method in the text.", fontsize=7)
    page.insert_text((72, 700), "2 The second note explains another detail and runs over", fontsize=7)
    page.insert_text((72, 709), "https://example.org/a/long/address/of/the/data", fontsize=7, fontname="cour")
    page.insert_text((72, 719), "3 The third note.", fontsize=7)
    doc2, page2 = new_doc()  # each note its own block; the second runs over onto a line of its own
    lines(page2, 72, 100, 30)
    for y, text in ((682, "1 The first note explains a detail."), (698, "2 The second note explains another detail and runs"),
                    (714, "over onto a second line without a mark."), (730, "3 The third note.")):
        page2.insert_text((72, y), text, fontsize=7)
    for d in (doc, doc2):
        regs = regions(d)
        notes = [r for r in regs if r["bbox"][1] >= 675 and r["bbox"][3] <= 735]
        assert len(notes) >= 1 and all(r["category"] == "Footnote" for r in notes), [(r["category"], r["text"][:20]) for r in notes]


def test_far_apart_rules_around_code_are_no_page_high_table():
    doc, _ = new_doc()
    page = doc.new_page(width=612, height=792)  # not the first page: no Title
    page.draw_line((72, 100), (540, 100), width=0.6)
    page.insert_text((72, 114), "Algorithm 1 Layout pass", fontsize=10, fontname="hebo")
    y = 130
    for i in range(14):
        page.insert_text((90, y), f"{i + 1}:", fontsize=9)
        page.insert_text((140, y), f"for each block b{i} in page do merge(b{i})", fontsize=9)
        y += 12
    page.draw_line((72, y), (540, y), width=0.6)
    page.insert_text((72, y + 20), "3 Results", fontsize=12, fontname="hebo")
    lines(page, 72, y + 40, 6)
    page.draw_line((72, y + 120), (540, y + 120), width=0.6)  # a rule under the text, 40 % apart from the first
    regs = regions(doc, 1)
    assert not [r for r in regs if r["category"] == "Table" and r["bbox"][3] - r["bbox"][1] > 0.3 * 792]
    assert cats(regs, "3 Results") == ["Section-header"]


def test_line_numbers_are_no_formula_and_no_footnotes():
    doc, page = new_doc()
    y, n = 80.0, 1
    while y < 760:
        page.insert_text((40, y), str(n), fontsize=7)
        if y < 700:
            page.insert_text((72, y), prose(13, n), fontsize=10)
        y, n = y + 12, n + 1
    regs = regions(doc)
    assert not [r for r in regs if r["text"].strip().isdigit()]
    assert not [r for r in regs if r["category"] in ("Formula", "Footnote")]
    assert all(r["bbox"][0] >= 70 for r in regs)
    doc2, page2 = new_doc()  # a tall table column of numbers inside the text block is kept
    lines(page2, 72, 80, 3)
    for i in range(12):
        page2.insert_text((72, 130 + 18 * i), f"run {i} of the experiment", fontsize=10)
        page2.insert_text((300, 130 + 18 * i), str(100 + 7 * i), fontsize=10)
    lines(page2, 72, 360, 3)
    text = " ".join(r["text"] for r in regions(doc2))
    assert all(str(100 + 7 * i) in text for i in range(12))


@pytest.mark.parametrize("number", ["12", "xii", "- 12 -", "Page 12"])
def test_bare_page_number_as_the_lowest_span_is_a_page_footer(number):
    doc, page = new_doc()
    y = lines(page, 72, 90, 52)  # text down to the bottom margin: no isolating gap
    page.insert_text((300, y + 2), number, fontsize=10)
    assert cats(regions(doc), number.split()[0]) == ["Page-footer"]


def test_double_spaced_lines_join_into_paragraphs():
    doc, page = new_doc()
    text = "     " + prose(90) + "\n     " + prose(90, 5)  # two indented paragraphs, justified
    page.insert_textbox(pymupdf.Rect(72, 80, 400, 700), text, fontsize=10, lineheight=2.4, align=pymupdf.TEXT_ALIGN_JUSTIFY)
    blocks = page.get_text("dict")["blocks"]
    assert len(blocks) >= 10 and all(len(b["lines"]) == 1 for b in blocks)  # pymupdf: a block per line
    regs = regions(doc)
    assert [r["category"] for r in regs] == ["Text", "Text"]
    assert regs[0]["text"].startswith(prose(3)) and regs[1]["text"].startswith(prose(3, 5))
