"""Seeded synthetic document pages with exact ground truth for all 11 DocLayNet classes.

The embedded default data set: every command runs without a download. A page is drawn with PIL
(one or two columns; title, page header/footer, section headers, paragraphs, list items, tables,
pictures, formulas, captions, footnotes); each region's box is computed from the same font metrics
that drew it, so boxes and spans are exact. Page ``i`` of seed ``s`` depends only on ``(s, i)``.
Pages of one synthetic document (``pages_per_doc``) share a topic (see ``synthetic_text``).
"""
from __future__ import annotations

import random
from functools import lru_cache
from typing import Iterator

from PIL import Image, ImageDraw, ImageFont

from gsdistill.tuples.sources.synthetic_draw import draw_picture, draw_table
from gsdistill.tuples.sources.synthetic_text import TOPIC_NAMES, TextMaker

# Block kinds filled into the columns, with their sampling weights.
_BLOCK_WEIGHTS = {"text": 0.42, "section": 0.13, "list": 0.11, "table": 0.1, "picture": 0.12, "formula": 0.12}


@lru_cache(maxsize=64)
def _font(size: int, bold: bool = False) -> ImageFont.FreeTypeFont:
    """DejaVu (math glyphs) where the system has it, else Pillow's built-in font."""
    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    try:
        return ImageFont.truetype(name, size)
    except OSError:
        return ImageFont.load_default(size)


def _unicode_ok() -> bool:
    return _font(12).getname()[0].startswith("DejaVu")


class _Page:
    """Drawing state of one page: records every region as a box and, when it has text, a span."""

    def __init__(self, rng: random.Random, text: TextMaker, width: int, height: int, text_scale: float = 1.0):
        self.rng, self.text, self.w, self.h = rng, text, width, height
        shade = rng.randint(240, 255)
        self.img = Image.new("RGB", (width, height), (shade, shade, rng.randint(235, 255)))
        self.draw = ImageDraw.Draw(self.img)
        # every size on the page (fonts, margins, gaps) scales with the page width; text_scale > 1 is
        # large print (fewer, bigger lines): legible in the small views a CPU run can afford
        self.s = width / 612.0 * text_scale
        self.body = max(6, round(rng.uniform(8.5, 11.5) * self.s))
        self.ink = (rng.randint(0, 40),) * 3
        self.spans: list[dict] = []
        self.boxes: list[dict] = []

    def add(self, category: str, bbox: list[float], text: str | None) -> None:
        bbox = [round(max(0.0, min(v, lim)), 1) for v, lim in zip(bbox, (self.w, self.h, self.w, self.h))]
        self.boxes.append({"category": category, "bbox": bbox})
        if text:
            self.spans.append({"text": text, "bbox": bbox, "category": category})

    def wrap(self, text: str, font, width: float, first_indent: float = 0.0) -> list[str]:
        lines, cur = [], ""
        for word in text.split():
            trial = f"{cur} {word}" if cur else word
            limit = width - (first_indent if not lines else 0.0)
            if cur and font.getlength(trial) > limit:
                lines.append(cur)
                cur = word
            else:
                cur = trial
        return lines + ([cur] if cur else [])

    def lines_height(self, n: int, size: int) -> float:
        asc, desc = _font(size).getmetrics()
        return (n - 1) * round(size * 1.3) + asc + desc if n else 0.0

    def text_block(self, category: str, text: str, x: float, y: float, width: float, size: int,
                   bold: bool = False, center: bool = False, indent: float = 0.0,
                   max_lines: int | None = None) -> float:
        """Draw wrapped text; record its exact box; return the y below it."""
        font = _font(size, bold)
        lines = self.wrap(text, font, width, indent)[:max_lines]
        if not lines:
            return y
        lead = round(size * 1.3)
        x0s, x1s = [], []
        for i, line in enumerate(lines):
            lw = font.getlength(line)
            lx = x + (width - lw) / 2 if center else x + (indent if i == 0 else 0.0)
            self.draw.text((lx, y + i * lead), line, font=font, fill=self.ink)
            x0s.append(lx)
            x1s.append(lx + lw)
        bottom = y + self.lines_height(len(lines), size)
        self.add(category, [min(x0s), y, max(x1s), bottom], " ".join(lines))
        return bottom


def _fill_column(p: _Page, x: float, y: float, width: float, bottom: float, counters: dict) -> None:
    rng, t = p.rng, p.text
    gap = round(p.body * 0.9)
    last = None
    while y < bottom - p.body * 2:
        kinds = [k for k in _BLOCK_WEIGHTS if not (k == last == "section")]
        kind = rng.choices(kinds, [_BLOCK_WEIGHTS[k] for k in kinds])[0]
        room = bottom - y
        if kind == "text":
            lead = round(p.body * 1.3)
            max_lines = max(1, int((room - p.body * 1.2) // lead) + 1)
            y = p.text_block("Text", t.paragraph(rng.randint(2, 5)), x, y, width, p.body,
                             indent=p.body * 1.5 * (rng.random() < 0.5), max_lines=max_lines)
        elif kind == "section":
            if room < p.body * 5:
                break
            counters["section"] += 1
            size = round(p.body * rng.uniform(1.1, 1.4))
            y = p.text_block("Section-header", t.heading(f"{counters['section']}."), x, y + gap * 0.5,
                             width, size, bold=True)
        elif kind == "list":
            bullet = rng.choice(["•", "–", "num"]) if _font(12).getname()[0].startswith("DejaVu") else "num"
            for i in range(rng.randint(2, 5)):
                if bottom - y < p.lines_height(3, p.body):
                    break
                mark = f"{i + 1}." if bullet == "num" else bullet
                y = p.text_block("List-item", f"{mark} {t.paragraph(rng.randint(1, 2))}", x + p.body,
                                 y, width - p.body, p.body) + gap * 0.4
        elif kind in ("table", "picture"):
            cap_h = p.lines_height(2, max(6, p.body - 1))
            h = min(room - cap_h - gap, rng.uniform(0.2, 0.45) * p.h)
            if h < p.body * 6:
                break
            counters[kind] += 1
            cap_size = max(6, p.body - 1)
            label = "Table" if kind == "table" else rng.choice(["Figure", "Fig."])
            caption = f"{label} {counters[kind]}: {t.sentence()}"
            if kind == "table":
                y = p.text_block("Caption", caption, x, y, width, cap_size) + gap * 0.4
                x1, y1, text = draw_table(p.draw, rng, t, x, y, width, h, _font(max(6, p.body - 1)), p.ink)
                p.add("Table", [x, y, x1, y1], text)
                y = y1
            else:
                pw = width * rng.uniform(0.55, 1.0)
                px = x + (width - pw) / 2
                draw_picture(p.draw, rng, px, y, px + pw, y + h)
                p.add("Picture", [px, y, px + pw, y + h], None)
                y = p.text_block("Caption", caption, x, y + h + gap * 0.5, width, cap_size)
        elif kind == "formula":
            if room < p.body * 4:
                break
            counters["formula"] += 1
            font = _font(p.body)
            expr = f"{t.formula(_unicode_ok())}"
            num = f"({counters['formula']})"
            ex_w, num_w = font.getlength(expr), font.getlength(num)
            fx = x + (width - ex_w) / 2
            p.draw.text((fx, y + gap * 0.5), expr, font=font, fill=p.ink)
            p.draw.text((x + width - num_w, y + gap * 0.5), num, font=font, fill=p.ink)
            fb = y + gap * 0.5 + p.lines_height(1, p.body)
            p.add("Formula", [min(fx, x + width - num_w), y + gap * 0.5, x + width, fb], f"{expr} {num}")
            y = fb
        last = kind
        y += gap


def render_page(seed: int, index: int, width: int = 612, height: int = 792, pages_per_doc: int = 4,
                text_scale: float = 1.0) -> dict:
    """Page ``index`` of the synthetic set ``seed`` (a page tuple; see ``gsdistill.tuples``); ``text_scale``
    multiplies every font, margin and gap (1.0 = a US-letter page's proportions)."""
    doc = index // pages_per_doc
    topic = random.Random(f"{seed}-doc-{doc}").choice(TOPIC_NAMES)
    rng = random.Random(f"{seed}-page-{index}")
    p = _Page(rng, TextMaker(rng, topic), width, height, text_scale)
    margin = round(rng.uniform(40, 70) * p.s)
    small = max(6, p.body - 2)
    top, bottom = margin, height - margin
    if rng.random() < 0.8:   # running page header
        y = top - p.lines_height(1, small) - 10 * p.s
        p.text_block("Page-header", p.text.title(), margin, max(2.0, y), width - 2 * margin, small,
                     center=rng.random() < 0.5)
    if rng.random() < 0.85:  # page footer with the page number
        label = str(index % pages_per_doc + 1) if rng.random() < 0.6 else f"Page {index % pages_per_doc + 1}"
        p.text_block("Page-footer", label, margin, bottom + 10 * p.s, width - 2 * margin, small, center=True)
    y = float(top)
    if index % pages_per_doc == 0 or rng.random() < 0.1:   # first page of a document carries a title
        y = p.text_block("Title", p.text.title(), margin, y, width - 2 * margin,
                         round(p.body * rng.uniform(1.7, 2.3)), bold=True, center=True) + p.body * 1.5
    if rng.random() < 0.35:  # footnotes at the bottom of the text area, under a short rule
        notes = [f"{i + 1} {p.text.sentence()}" for i in range(rng.randint(1, 2))]
        fn_h = sum(p.lines_height(2, small) for _ in notes)
        fy = bottom - fn_h - p.body
        p.draw.line([(margin, fy - 4 * p.s), (margin + 0.3 * (width - 2 * margin), fy - 4 * p.s)], fill=p.ink)
        for note in notes:
            fy = p.text_block("Footnote", note, margin, fy, width - 2 * margin, small) + 2 * p.s
        bottom = bottom - fn_h - p.body * 2
    counters = {"section": rng.randint(0, 4), "table": rng.randint(0, 3), "picture": rng.randint(0, 3), "formula": 0}
    if rng.random() < 0.5:
        _fill_column(p, margin, y, width - 2 * margin, bottom, counters)
    else:
        gutter = round(rng.uniform(12, 24) * p.s)
        col_w = (width - 2 * margin - gutter) / 2
        _fill_column(p, margin, y, col_w, bottom, counters)
        _fill_column(p, margin + col_w + gutter, y, col_w, bottom, counters)
    spans = _reading_order(p.spans)
    return {"id": f"synthetic-{seed}-{index:07d}", "image": p.img, "width": width, "height": height,
            "spans": spans, "boxes": p.boxes, "source": "synthetic", "doc_id": f"synthetic-{seed}-doc{doc:06d}"}


def _reading_order(spans: list[dict]) -> list[dict]:
    """Header first, footer last, footnotes before the footer; the rest in drawing order (which is
    the column-wise reading order: full-width title, left column, right column)."""
    rank = {"Page-header": 0, "Footnote": 2, "Page-footer": 3}
    return sorted(spans, key=lambda s: rank.get(s["category"], 1))


def generate_pages(n: int, seed: int = 0, width: int = 612, height: int = 792, start: int = 0,
                   pages_per_doc: int = 4, text_scale: float = 1.0) -> Iterator[dict]:
    """``n`` synthetic page tuples, pages ``start .. start+n-1`` of the set ``seed``."""
    if width < 200 or height < 200:
        raise ValueError(f"synthetic pages need at least 200x200 pixels, got {width}x{height}")
    if not 0.5 <= text_scale <= 4.0:
        raise ValueError(f"synthetic text_scale must be in [0.5, 4], got {text_scale}")
    for i in range(start, start + n):
        yield render_page(seed, i, width, height, pages_per_doc, text_scale)
