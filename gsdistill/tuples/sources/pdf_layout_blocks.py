"""Text-block fixes around the per-block classification of ``pdf_layout`` (PDF points throughout).

Before classification:

* ``drop_line_numbers``: a column of >= 8 bare numbers (1-4 digits) sharing their left or right
  edge (3 pt) with one number, over >= 30 % of the page height, in the margin left or right of
  all other text (a table's column of numbers stays) is a manuscript's line numbering: those lines are no
  layout region (once one page-high Formula plus ~13 Footnotes per page).
* ``split_by_style``: pymupdf often puts a heading and the paragraph next to it in one block. A
  block is cut where the line style (dominant size, bold, italic, all capitals) changes, so a
  heading line becomes a block of its own.
* ``mark_list_runs``: blocks starting with an enumeration whose neighbour above or below (within
  1.5 x body) does too are list items ("1. first", "2. second"), never numbered headings.
* ``mark_margins``: the isolated topmost / bottommost short block (a gap of >= 1.5 x body to the
  rest, inside the top / bottom 16 %) is a running head / foot; a bare page number ("12",
  "- 12 -", "Page 12", "xii") that is the lowest (highest) block in the bottom (top) 20 % is one
  without any gap.

After classification (regions ``{category, bbox, text, size, rows}``):

* ``fix_footnotes``: small text (<= 0.92 x body) right under a Footnote in its column continues it
  or is the next note (stacked footnotes, also when the last one reaches into the bottom margin
  band); a Footnote with body-size content below it in its column is Text.
* ``merge_spaced_lines``: on a page where most Text regions are single lines (double-spaced
  theses: pymupdf makes a block of every line) consecutive lines of one column join into
  paragraphs; a paragraph ends at an indented line or after a short line.
* ``subfigure_captions``: "(a) ..." right under or over a Picture is a Caption, not a List-item.
* ``merge_titles``: consecutive Title blocks less than 3/4 of their size apart are one Title.
* ``reading_order``: see ``pdf_layout``.
"""
from __future__ import annotations

import re

from gsdistill.tuples.sources.pdf_layout import _FOOT_MARK, BULLET, HEADING_NUMBER, SUBFIGURE, block_stats, centre_inside, union_box

_LINE_NUMBER = re.compile(r"^\d{1,4}$")
_PAGE_NUMBER = re.compile(r"^\s*([-\u2013\u2014]\s*)?((page|p\.)\s*)?(\d{1,4}|[ivxlc]{1,6})(\s*(/|of)\s*\d{1,4})?"
                          r"(\s*[-\u2013\u2014])?\s*$", re.I)


def make_block(lines: list[dict]) -> dict:
    return {"lines": lines, "bbox": union_box(ln["bbox"] for ln in lines),
            "text": " ".join(ln["text"] for ln in lines), "stats": block_stats(lines)}


def drop_line_numbers(blocks: list[dict], page_h: float) -> list[dict]:
    numbers = [ln for b in blocks for ln in b["lines"] if _LINE_NUMBER.match(ln["text"].strip())]
    others = [ln["bbox"] for b in blocks for ln in b["lines"] if not _LINE_NUMBER.match(ln["text"].strip())]
    left = min((o[0] for o in others), default=0.0)
    right = max((o[2] for o in others), default=0.0)
    drop: set[int] = set()
    for ln in numbers:
        column = [m for m in numbers if abs(m["bbox"][2] - ln["bbox"][2]) <= 3 or abs(m["bbox"][0] - ln["bbox"][0]) <= 3]
        ys = [m["bbox"][1] for m in column]
        # in a margin beside all the text: a table's column of numbers is not line numbering
        in_margin = max(m["bbox"][2] for m in column) <= left + 2 or min(m["bbox"][0] for m in column) >= right - 2
        if len(column) >= 8 and max(ys) - min(ys) >= 0.3 * page_h and in_margin:
            drop.update(id(m) for m in column)
    if not drop:
        return blocks
    out = []
    for b in blocks:
        kept = [ln for ln in b["lines"] if id(ln) not in drop]
        if kept:
            out.append(b if len(kept) == len(b["lines"]) else make_block(kept))
    return out


def _style(line: dict, body: float) -> tuple:
    st = block_stats([line])
    return (st["size"] >= body * 1.12, st["size"] <= body * 0.92, st["bold"] >= 0.6, st["italic"] >= 0.6,
            st["caps"] >= 0.9 and st["letters"] >= 4)


def split_by_style(blocks: list[dict], body: float) -> list[dict]:
    out = []
    for b in blocks:
        lines = sorted(b["lines"], key=lambda ln: (round(ln["bbox"][1]), ln["bbox"][0]))
        rows: list[list[dict]] = []  # pieces of one visual line stay together
        for ln in lines:
            if rows and abs((ln["bbox"][1] + ln["bbox"][3]) / 2 - (rows[-1][0]["bbox"][1] + rows[-1][0]["bbox"][3]) / 2) <= 2:
                rows[-1].append(ln)
            else:
                rows.append([ln])
        if len(rows) < 2:
            out.append(b)
            continue
        styles = [_style({"spans": [s for ln in row for s in ln["spans"]], "text": " ".join(ln["text"] for ln in row)}, body)
                  for row in rows]
        left = min(ln["bbox"][0] for ln in lines)
        start, pieces = 0, []
        for i in range(1, len(rows) + 1):
            indent = i < len(rows) and left + 0.8 * body < min(ln["bbox"][0] for ln in rows[i]) < left + 4 * body \
                and max(ln["bbox"][2] for ln in rows[i - 1]) >= max(ln["bbox"][2] for ln in lines) - 2 * body
            if i == len(rows) or styles[i] != styles[i - 1] or indent:
                pieces.append(rows[start:i])
                start = i
        if len(pieces) == 1:
            out.append(b)
        else:
            out.extend(make_block([ln for row in piece for ln in row]) for piece in pieces)
    return out


def mark_list_runs(blocks: list[dict], body: float) -> None:
    numbered = [b for b in blocks if BULLET.match(b["text"]) or HEADING_NUMBER.match(b["text"])]
    for b in numbered:
        for o in numbered:
            if o is not b and min(b["bbox"][2], o["bbox"][2]) > max(b["bbox"][0], o["bbox"][0]) and \
                    (0 <= o["bbox"][1] - b["bbox"][3] <= 1.5 * body or 0 <= b["bbox"][1] - o["bbox"][3] <= 1.5 * body):
                b["in_list"] = True
                break


def mark_margins(blocks: list[dict], body: float, page_h: float) -> None:
    if not blocks:
        return
    top = min(blocks, key=lambda b: b["bbox"][1])
    bottom = max(blocks, key=lambda b: b["bbox"][3])
    if _PAGE_NUMBER.match(top["text"]) and top["bbox"][3] <= 0.2 * page_h:
        top["margin"] = "top"
    if _PAGE_NUMBER.match(bottom["text"]) and bottom["bbox"][1] >= 0.8 * page_h:
        bottom["margin"] = "bottom"
    if len(blocks) < 2:
        return
    below = min(b["bbox"][1] for b in blocks if b is not top)
    if top["bbox"][3] <= 0.16 * page_h and below - top["bbox"][3] >= 1.5 * body:
        top["margin"] = "top"
    above = max(b["bbox"][3] for b in blocks if b is not bottom)
    if bottom is not top and bottom["bbox"][1] >= 0.84 * page_h and bottom["bbox"][1] - above >= 1.5 * body:
        bottom["margin"] = "bottom"


def _same_column(a, b) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > 0.3 * min(a[2] - a[0], b[2] - b[0])


def fix_footnotes(regions: list[dict], body: float) -> None:
    notes = sorted((r for r in regions if r["category"] == "Footnote"), key=lambda r: r["bbox"][1])
    for note in notes:  # continuations and further notes: small text right below a footnote
        for q in sorted(regions, key=lambda r: r["bbox"][1]):
            further = q["category"] == "Page-footer" and len(q["text"]) > 3 and _FOOT_MARK.match(q["text"])
            if (q["category"] == "Text" or further) and (q.get("size") or body) <= body * 0.92 and \
                    _same_column(q["bbox"], note["bbox"]) and 0 <= q["bbox"][1] - note["bbox"][3] <= 1.5 * body:
                q["category"] = "Footnote"
                note = q
    for r in regions:
        if r["category"] != "Footnote":
            continue
        for q in regions:
            if q["category"] not in ("Footnote", "Page-footer", "Page-header") and q["bbox"][1] >= r["bbox"][3] - 1 \
                    and _same_column(q["bbox"], r["bbox"]) and q.get("size", body) > body * 0.92:
                r["category"] = "Text"
                break


def merge_spaced_lines(regions: list[dict], body: float) -> list[dict]:
    texts = sorted((r for r in regions if r["category"] == "Text"), key=lambda r: (r["bbox"][1], r["bbox"][0]))
    single = [r for r in texts if r.get("rows", 1) == 1]
    spaced = len(single) >= 8 and len(single) >= 0.6 * len(texts)
    max_gap = 2.2 * body if spaced else 0.4 * body  # otherwise only pieces pymupdf split off a paragraph
    merged: list[dict] = []
    for r in texts:
        host = next((m for m in reversed(merged) if _same_column(m["bbox"], r["bbox"])), None)
        small = r["bbox"][3] - r["bbox"][1] <= 2 * body and len(r["text"]) <= 40
        if host is not None and small and centre_inside(r["bbox"], host["bbox"], tol=1.0):
            host["text"] += " " + r["text"]  # a fragment (inline math) inside a paragraph
            host["bbox"] = union_box([host["bbox"], r["bbox"]])
        elif host is not None and (spaced and r.get("rows", 1) == 1 or r["text"][:1].islower()) and \
                _continues(host, r, body, max_gap):
            host["bbox"] = union_box([host["bbox"], r["bbox"]])
            host["text"] += " " + r["text"]
            host["last"] = r["bbox"]
            host["rows"] = host.get("rows", 1) + r.get("rows", 1)
        else:
            merged.append({**r, "last": r["bbox"]})
    for m in merged:
        m.pop("last", None)
    return [r for r in regions if r["category"] != "Text"] + merged


def _continues(host: dict, r: dict, body: float, max_gap: float) -> bool:
    last, b = host["last"], r["bbox"]
    gap = b[1] - last[3]
    full = last[2] >= max(host["bbox"][2], b[2]) - 2 * body  # the previous line ran to the column's end
    indented = b[0] > host["bbox"][0] + 0.5 * body
    return -1 <= gap <= max_gap and full and not indented and \
        abs((r.get("size") or body) - (host.get("size") or body)) < 0.6


def extend_captions(regions: list[dict], body: float) -> None:
    """Text set tight under a Caption in its size (pymupdf's second block of a long caption) is
    part of it; the absorbed region is marked ``category = None`` for the caller to drop."""
    for cap in sorted((r for r in regions if r["category"] == "Caption"), key=lambda r: r["bbox"][1]):
        for q in sorted(regions, key=lambda r: r["bbox"][1]):
            if q["category"] == "Text" and _same_column(q["bbox"], cap["bbox"]) and \
                    -1 <= q["bbox"][1] - cap["bbox"][3] <= 0.5 * body and q["bbox"][0] >= cap["bbox"][0] - 1 and \
                    abs((q.get("size") or body) - (cap.get("size") or body)) < 0.6 and q.get("rows", 1) <= 2:
                cap["bbox"] = union_box([cap["bbox"], q["bbox"]])
                cap["text"] += " " + q["text"]
                q["category"] = None


def merge_titles(regions: list[dict], body: float) -> list[dict]:
    """A title set on two lines that pymupdf gave two blocks is one Title (gap under 3/4 of its size)."""
    titles = sorted((r for r in regions if r["category"] == "Title"), key=lambda r: r["bbox"][1])
    for a, b in zip(titles, titles[1:]):
        gap = b["bbox"][1] - a["bbox"][3]
        if a["category"] == "Title" and 0 <= gap <= max(body, 0.75 * (a.get("size") or body)) and \
                _same_column(a["bbox"], b["bbox"]):
            b["bbox"], b["text"] = union_box([a["bbox"], b["bbox"]]), a["text"] + " " + b["text"]
            a["category"] = None
    return [r for r in regions if r["category"] is not None]


def subfigure_captions(regions: list[dict], body: float) -> None:
    pictures = [r["bbox"] for r in regions if r["category"] == "Picture"]
    for r in regions:
        if r["category"] in ("List-item", "Text") and SUBFIGURE.match(r["text"]) and r.get("rows", 1) <= 3:
            b = r["bbox"]
            if any(_same_column(b, p) and (0 <= b[1] - p[3] <= 2.5 * body or 0 <= p[1] - b[3] <= 2.5 * body)
                   for p in pictures):
                r["category"] = "Caption"


def reading_order(regions: list[dict], page_w: float) -> list[dict]:
    """Headers, body (bands split at full-width regions; left column before right), footnotes, footers."""
    rank = {"Page-header": 0, "Footnote": 2, "Page-footer": 3}
    body = sorted((r for r in regions if r["category"] not in rank), key=lambda r: (r["bbox"][1], r["bbox"][0]))
    xs = [r["bbox"] for r in body]
    left = min((b[0] for b in xs), default=0.0)
    right = max((b[2] for b in xs), default=page_w)
    mid, full = (left + right) / 2, 0.6 * max(right - left, 1.0)
    ordered, band = [], []

    def flush():
        band.sort(key=lambda r: (r["bbox"][0] >= mid - 2, r["bbox"][1], r["bbox"][0]))
        ordered.extend(band)
        band.clear()

    for r in body:
        b = r["bbox"]
        if b[2] - b[0] >= full or (b[0] < mid - 10 and b[2] > mid + 10):
            flush()
            ordered.append(r)
        else:
            band.append(r)
    flush()
    head = sorted((r for r in regions if r["category"] == "Page-header"), key=lambda r: (r["bbox"][1], r["bbox"][0]))
    notes = sorted((r for r in regions if r["category"] == "Footnote"), key=lambda r: (r["bbox"][1], r["bbox"][0]))
    foot = sorted((r for r in regions if r["category"] == "Page-footer"), key=lambda r: (r["bbox"][1], r["bbox"][0]))
    return head + ordered + notes + foot
