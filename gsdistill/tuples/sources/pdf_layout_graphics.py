"""Layout from a PDF page's drawings and images: Table (ruled) and Picture regions.

* **Table**: >= 2 horizontal rules with matching left/right ends (4 pt), each within
  ``TABLE_RULE_GAP`` (20 %) of the page height of the previous one (booktabs' three rules, ruled
  grids), enclosing text laid out in >= 2 columns on >= 2 rows; the region is the rules' extent.
  Not a table: a frame whose text is mostly monospaced (code listings), holds an
  "Algorithm N" line (algorithm boxes) or is mostly prose (lines of >= 10 words): framed code and
  algorithms drawn with the same rules once became page-high Tables swallowing headings.
  Also a Table (``find_drawn_tables``): a cluster of drawings, each a rectangle or a short path of
  axis-parallel strokes (no curve, diagonal, polyline or dashed guide), around the same columnar,
  non-code text covering >= 5 % of it, on at most half the page. Tables with vertical rules (hhline
  and longtable cut their rules into per-cell pieces whose ends never match) and coloured cells
  (colortbl) once became Pictures.
* **Picture**: image blocks (>= 16 pt each side) and clusters of vector drawings covering >= 1% of
  the page with both sides >= 30 pt, unless the cluster is only a frame/background behind text
  (<= 6 rectangles, text covering >= 30% of it) or a box ruled around text (a rule across its top and
  bottom, only straight strokes of >= 10 pt: framed code, macro signatures, notices, whose text stays
  text). Text inside either is absorbed by the caller.
"""
from __future__ import annotations

import re

from gsdistill.tuples.sources.pdf_layout import _MONO_FONT, _area, centre_inside, union_box

TABLE_RULE_GAP = 0.2
DRAWN_TABLE_TEXT = 0.05  # share of a drawn table's area its text covers (tables: 7-53 %; line sketches: 2 %)
COLUMN_GAP = 6.0  # pt between neighbouring pieces of one row that separates two columns
_ALGORITHM = re.compile(r"^\s*(algorithm|procedure|listing)\s*\d", re.I)


def horizontal_rules(drawings: list[dict]) -> list[list[float]]:
    rules = []
    for d in drawings:
        r = d["rect"]
        if r[2] - r[0] >= 30 and r[3] - r[1] <= 2.5:
            rules.append([r[0], r[1], r[2], r[3]])
    return sorted(rules, key=lambda r: r[1])


def _columns_inside(region, lines: list[dict], min_rows: int = 2) -> bool:
    """True when text inside ``region`` forms >= 2 columns on >= ``min_rows`` rows.

    A row is the text pieces (spans) whose heights overlap; it has columns when two pieces next to each
    other on it are more than ``COLUMN_GAP`` apart (a word space is 2-4 pt). Counting every far-apart pair
    on a line instead made any ruled one-line box of >= 3 words a "table" (l3doc's framed macro signatures).
    """
    pieces = sorted((s["bbox"] for line in lines if centre_inside(line["bbox"], region)
                     for s in line["spans"] if s["text"].strip()), key=lambda b: (b[1] + b[3]) / 2)
    rows: list[list] = []
    band = [0.0, 0.0]  # the vertical extent of the last row
    for b in pieces:
        if rows and min(band[1], b[3]) - max(band[0], b[1]) > 0.5 * min(band[1] - band[0], b[3] - b[1]):
            rows[-1].append(b)
            band = [min(band[0], b[1]), max(band[1], b[3])]
        else:
            rows.append([b])
            band = [b[1], b[3]]
    with_columns = 0
    for row in rows:
        row.sort(key=lambda b: b[0])
        with_columns += any(b[0] - a[2] > COLUMN_GAP for a, b in zip(row, row[1:]))
    return with_columns >= min_rows


def _not_tabular(region, lines: list[dict]) -> bool:
    """A ruled frame around code, an algorithm or prose rather than a table."""
    inside = [ln for ln in lines if centre_inside(ln["bbox"], region)]
    chars = sum(len(s["text"].strip()) for ln in inside for s in ln["spans"]) or 1
    mono = sum(len(s["text"].strip()) for ln in inside for s in ln["spans"]
               if s.get("flags", 0) & 8 or _MONO_FONT.search(s.get("font", "")))
    prose = sum(len(ln["text"].split()) >= 10 for ln in inside)
    return mono / chars >= 0.5 or any(_ALGORITHM.match(ln["text"]) for ln in inside) or \
        (len(inside) >= 3 and prose / len(inside) >= 0.4)


def _members(drawings: list[dict], region) -> list[dict]:
    """The drawings of ``region`` (their centres inside it): a cluster's or a table's pieces."""
    return [d for d in drawings if centre_inside(d["rect"], region, tol=0.5)]


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
        if len(group) >= 2 and _columns_inside(region, lines) and not _not_tabular(region, lines) \
                and not _dashed(_members(drawings, region)):
            tables.append(region)  # (dashed guides between the rules: a sketch of a page, not a table)
    return tables


def find_drawn_tables(drawings: list[dict], clusters: list[list[float]], lines: list[dict],
                      tables: list[list[float]], page_area: float) -> list[list[float]]:
    """``tables`` plus the regions of clusters of axis-parallel drawings (ruled grids, coloured cells) around
    columnar text; a rule-found table inside such a region (one ruled band of the grid) joins it."""
    found = []
    for c in clusters:
        if c[2] - c[0] < 30 or c[3] - c[1] < 15 or any(centre_inside(c, t) for t in tables):
            continue
        if _area(c) > 0.5 * page_area:
            continue  # a slide's background and boxes behind its bullets; a full-page grid is rule-found
        members = _members(drawings, c)
        if len(members) < 2 or not all(_grid_piece(d) for d in members):
            continue  # curves, diagonals, polylines: a drawing
        inside = [s["bbox"] for ln in lines if centre_inside(ln["bbox"], c) for s in ln["spans"] if s["text"].strip()]
        if sum(_area(b) for b in inside) < DRAWN_TABLE_TEXT * _area(c):
            continue  # a few labels in a line drawing (layout's page sketch: 2 % text), not cells of text
        if _columns_inside(c, lines) and not _not_tabular(c, lines) and not _ruled_box(members, c) \
                and not _dashed(members):
            found.append(list(c))
    bands = [[t for t in tables if centre_inside(t, f)] for f in found]
    kept = [t for t in tables if not any(t in b for b in bands)]
    return kept + [union_box([f, *b]) for f, b in zip(found, bands)]


def _dashed(members: list[dict], at_least: int = 5) -> bool:
    """True when ``members`` hold >= ``at_least`` dashes: short (< 3 pt) axis-parallel pieces whose ends touch
    no other piece (geometry's page sketches). The rules of hhline and longtable are cut into pieces just as
    short, but each piece meets the next."""
    segments = []
    for d in members:
        for item in d.get("items", []):
            if item[0] == "l":
                segments.append((item[1].x, item[1].y, item[2].x, item[2].y))
            elif item[0] == "re" and min(item[1].width, item[1].height) <= 2.5:
                r = item[1]
                segments.append((r.x0, (r.y0 + r.y1) / 2, r.x1, (r.y0 + r.y1) / 2) if r.height <= 2.5
                                else ((r.x0 + r.x1) / 2, r.y0, (r.x0 + r.x1) / 2, r.y1))
    boxes = [(min(s[0], s[2]) - 0.6, min(s[1], s[3]) - 0.6, max(s[0], s[2]) + 0.6, max(s[1], s[3]) + 0.6)
             for s in segments]
    cells: dict[tuple[int, int], list[int]] = {}  # a 4 pt grid, so a grid of thousands of pieces stays linear
    for j, b in enumerate(boxes):
        for gx in range(int(b[0] // 4), int(b[2] // 4) + 1):
            for gy in range(int(b[1] // 4), int(b[3] // 4) + 1):
                cells.setdefault((gx, gy), []).append(j)
    dashes = 0
    for i, s in enumerate(segments):
        if max(abs(s[2] - s[0]), abs(s[3] - s[1])) >= 3:
            continue
        if not any(j != i and boxes[j][0] <= x <= boxes[j][2] and boxes[j][1] <= y <= boxes[j][3]
                   for x, y in (s[:2], s[2:]) for j in cells.get((int(x // 4), int(y // 4)), ())):
            dashes += 1
            if dashes >= at_least:
                return True
    return False


def _grid_piece(drawing: dict) -> bool:
    """True when a drawing could be a piece of a table: a rectangle (a cell, a rule) or a short path of
    horizontal and vertical strokes (a frame). LaTeX draws every rule and cell on its own; a path of many
    pieces is a plot's polyline or step curve, a filled path that is not a rectangle is a shape."""
    items = drawing.get("items", [])
    if len(items) > 4 or (drawing.get("fill") is not None and any(item[0] != "re" for item in items)):
        return False
    for item in items:
        if item[0] == "l":
            if abs(item[1].x - item[2].x) > 0.5 and abs(item[1].y - item[2].y) > 0.5:
                return False  # a diagonal: arrows, plots, sketches
        elif item[0] != "re":
            return False  # curves, quads
    return True


def find_pictures(image_rects: list[list[float]], drawings: list[dict], clusters: list[list[float]],
                  lines: list[dict], page_w: float, page_h: float, tables: list[list[float]]) -> list[list[float]]:
    """Picture regions from image blocks and from clusters of vector drawings (not frames, not tables)."""
    pics = [r for r in image_rects if r[2] - r[0] >= 16 and r[3] - r[1] >= 16]
    for c in clusters:
        w, h = c[2] - c[0], c[3] - c[1]
        if w < 30 or h < 30 or _area(c) < 0.01 * page_w * page_h or any(centre_inside(c, t) for t in tables):
            continue
        members = _members(drawings, c)
        rects_only = all(all(item[0] == "re" for item in d.get("items", [])) for d in members)
        inside = [ln for ln in lines if centre_inside(ln["bbox"], c)]
        text_area = sum(_area(ln["bbox"]) for ln in inside)
        if rects_only and len(members) <= 6 and text_area >= 0.3 * _area(c):
            continue  # a frame or shaded background behind text, not a picture
        if inside and _ruled_box(members, c):
            continue  # a box ruled around text (framed code, macro signatures, notices): its text is text
        pics.append(list(c))
    return _merge_overlapping(pics)


def _ruled_box(members: list[dict], region) -> bool:
    """True when ``members`` draw a box of rules: a rule across the top and the bottom of ``region`` and
    otherwise only unfilled straight horizontal or vertical strokes of >= 10 pt, none a path of more than four. A
    diagram has curves, diagonals, dashes (geometry's page sketches: 1.3 pt dashes) or polylines (a plot's step
    curve); a box drawn around text has none of them."""
    width = region[2] - region[0]
    top = bottom = False
    for d in members:
        if d.get("fill") is not None or len(d.get("items", [])) > 4:
            return False  # filled shapes (shaded cells, drawings; the frame rule above takes backgrounds), polylines
        for item in d.get("items", []):
            if item[0] == "re":
                r = item[1]
                segments = [(r.x0, r.y0, r.x1, r.y0), (r.x0, r.y1, r.x1, r.y1)] if r.height > 2.5 else \
                    [(r.x0, (r.y0 + r.y1) / 2, r.x1, (r.y0 + r.y1) / 2)]
            elif item[0] == "l":
                segments = [(item[1].x, item[1].y, item[2].x, item[2].y)]
            else:
                return False  # curves, quads: drawn shapes
            for x0, y0, x1, y1 in segments:
                horizontal, vertical = abs(y1 - y0) <= 0.5, abs(x1 - x0) <= 0.5
                if not (horizontal or vertical) or max(abs(x1 - x0), abs(y1 - y0)) < 10:
                    return False
                if horizontal and abs(x1 - x0) >= 0.9 * width:
                    top |= abs(y0 - region[1]) <= 3
                    bottom |= abs(y0 - region[3]) <= 3
    return top and bottom


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
