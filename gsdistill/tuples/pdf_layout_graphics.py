"""Layout from a PDF page's drawings and images: Table (ruled) and Picture regions.

* **Table**: >= 2 horizontal rules with matching left/right ends (4 pt), each within
  ``TABLE_RULE_GAP`` (20 %) of the page height of the previous one (booktabs' three rules, ruled
  grids), enclosing text laid out in >= 2 columns on >= 2 rows; the region is the rules' extent.
  Not a table: a frame whose text is mostly monospaced (code listings), holds an
  "Algorithm N" line (algorithm boxes) or is mostly prose (lines of >= 10 words): framed code and
  algorithms drawn with the same rules once became page-high Tables swallowing headings.
* **Picture**: image blocks (>= 16 pt each side) and clusters of vector drawings covering >= 1% of
  the page with both sides >= 30 pt, unless the cluster is only a frame/background behind text
  (<= 6 rectangles, text covering >= 30% of it). Text inside either is absorbed by the caller.
"""
from __future__ import annotations

import re

from gsdistill.tuples.pdf_layout import _MONO_FONT, _area, centre_inside, union_box

TABLE_RULE_GAP = 0.2
_ALGORITHM = re.compile(r"^\s*(algorithm|procedure|listing)\s*\d", re.I)


def horizontal_rules(drawings: list[dict]) -> list[list[float]]:
    rules = []
    for d in drawings:
        r = d["rect"]
        if r[2] - r[0] >= 30 and r[3] - r[1] <= 2.5:
            rules.append([r[0], r[1], r[2], r[3]])
    return sorted(rules, key=lambda r: r[1])


def _columns_inside(region, lines: list[dict], min_rows: int = 2) -> bool:
    """True when text inside ``region`` forms >= 2 columns on >= ``min_rows`` rows."""
    pieces = []
    for line in lines:
        if not centre_inside(line["bbox"], region):
            continue
        for s in line["spans"]:
            pieces.append(s["bbox"])
    rows = 0
    pieces.sort(key=lambda b: (round(b[1]), b[0]))
    for i, a in enumerate(pieces):
        for b in pieces[i + 1:]:
            if b[1] > a[3]:
                break
            overlap = min(a[3], b[3]) - max(a[1], b[1])
            if overlap > 0.5 * min(a[3] - a[1], b[3] - b[1]) and b[0] - a[2] > 6:
                rows += 1
                break
    return rows >= min_rows


def _not_tabular(region, lines: list[dict]) -> bool:
    """A ruled frame around code, an algorithm or prose rather than a table."""
    inside = [ln for ln in lines if centre_inside(ln["bbox"], region)]
    chars = sum(len(s["text"].strip()) for ln in inside for s in ln["spans"]) or 1
    mono = sum(len(s["text"].strip()) for ln in inside for s in ln["spans"]
               if s.get("flags", 0) & 8 or _MONO_FONT.search(s.get("font", "")))
    prose = sum(len(ln["text"].split()) >= 10 for ln in inside)
    return mono / chars >= 0.5 or any(_ALGORITHM.match(ln["text"]) for ln in inside) or \
        (len(inside) >= 3 and prose / len(inside) >= 0.4)


def find_tables(drawings: list[dict], lines: list[dict], page_h: float) -> list[list[float]]:
    """Table regions from stacked horizontal rules that enclose columnar text."""
    rules, tables, used = horizontal_rules(drawings), [], set()
    for i, r in enumerate(rules):
        if i in used:
            continue
        group = [r]
        for j in range(i + 1, len(rules)):
            s = rules[j]
            if abs(s[0] - r[0]) < 4 and abs(s[2] - r[2]) < 4 and s[1] - group[-1][3] < page_h * TABLE_RULE_GAP:
                if s[1] - group[-1][1] > 3:  # a double rule counts once
                    group.append(s)
                used.add(j)
        region = union_box(group)
        if len(group) >= 2 and _columns_inside(region, lines) and not _not_tabular(region, lines):
            tables.append(region)
    return tables


def find_pictures(image_rects: list[list[float]], drawings: list[dict], clusters: list[list[float]],
                  lines: list[dict], page_w: float, page_h: float, tables: list[list[float]]) -> list[list[float]]:
    """Picture regions from image blocks and from clusters of vector drawings (not frames, not tables)."""
    pics = [r for r in image_rects if r[2] - r[0] >= 16 and r[3] - r[1] >= 16]
    for c in clusters:
        w, h = c[2] - c[0], c[3] - c[1]
        if w < 30 or h < 30 or _area(c) < 0.01 * page_w * page_h or any(centre_inside(c, t) for t in tables):
            continue
        members = [d for d in drawings if centre_inside(d["rect"], c, tol=0.5)]
        rects_only = all(all(item[0] == "re" for item in d.get("items", [])) for d in members)
        text_area = sum(_area(ln["bbox"]) for ln in lines if centre_inside(ln["bbox"], c))
        if rects_only and len(members) <= 6 and text_area >= 0.3 * _area(c):
            continue  # a frame or shaded background behind text, not a picture
        pics.append(list(c))
    return _merge_overlapping(pics)


def _merge_overlapping(rects: list[list[float]]) -> list[list[float]]:
    rects = [list(r) for r in rects]
    merged = True
    while merged:
        merged = False
        for i in range(len(rects)):
            for j in range(i + 1, len(rects)):
                a, b = rects[i], rects[j]
                if a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]:
                    rects[i] = union_box([a, b])
                    del rects[j]
                    merged = True
                    break
            if merged:
                break
    return rects
