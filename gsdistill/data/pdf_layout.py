"""Layout heuristics for born-digital PDF pages: text blocks, rules and images -> DocLayNet regions.

Input is what pymupdf reports for one page (``get_text("dict")`` blocks, ``get_drawings()``), in
PDF points. Every rule below is relative to the page so it works at any page size:

* **body size** = the character-weighted most common font size of the page (rounded to 0.5 pt).
* **Page-header / Page-footer**: a short block (<= 2 lines, <= 80 chars, not larger than body)
  wholly inside the top / bottom ``MARGIN_BAND`` of the page height; or the page's topmost /
  bottommost short block inside the top / bottom 16% when a gap of >= 1.5 x body separates it
  from every other block (LaTeX's running heads and page numbers sit in wide margins).
* **Caption**: block text begins with "Figure/Fig./Table/Tab./Listing/Algorithm/Scheme N" followed
  by ":", "." or a dash (so "Figure 3 shows ..." in running text stays Text).
* **Formula**: >= ``MATH_SHARE`` of the block's characters are set in math fonts (CMMI, CMSY, CMEX,
  MSAM/MSBM, *Math*, Symbol, ...), or >= 15% with an equation number "(3.12)" ending a line, or
  the block is only an equation number. pymupdf cuts
  display math into many small blocks: formula blocks closer than 0.8 x body vertically and
  3 x body horizontally are merged (``merge_formulas``), taking along short (<= 40 chars) one-line
  text blocks between them (operators and numbers set in text fonts).
* **Title**: on a document's first page, the largest block of size >= 1.25 x body in the top 45%.
* **Section-header**: <= 3 lines, <= 160 chars, and size >= 1.12 x body or >= 80% bold characters
  with at most 2 lines.
* **Footnote**: size <= 0.92 x body, in the bottom 35% of the page, starting with a superscript
  span or a footnote mark (digit, *, dagger, double dagger, section sign), with no other body
  region below it in its column and under a quarter of its characters in a monospaced font
  (numbered code lines in small type are not footnotes).
* **List-item**: a line starting with a bullet glyph or an enumeration ("1.", "(a)", "iv)");
  a block holding several items is split into one region per item.
* **Table**: >= 2 horizontal rules with matching left/right ends stacked within 40% of the page
  height (booktabs' three rules, ruled grids), enclosing text laid out in >= 2 columns on
  >= 2 rows; the region is the rules' extent. Text inside is absorbed (spans keep class Table).
* **Picture**: image blocks (>= 16 pt each side) and clusters of vector drawings covering >= 1% of
  the page with both sides >= 30 pt, unless the cluster is only a frame/background behind text
  (<= 6 rectangles, text covering >= 30% of it). Text inside (axis labels) is absorbed.
* **Text**: every other text block.

Reading order (``reading_order``): page headers, then the body split into bands at full-width
blocks; inside a band, blocks of the left column before the right one, each top to bottom; then
footnotes, then page footers.
"""
from __future__ import annotations

import re
from collections import Counter

MARGIN_BAND = 0.09
MATH_SHARE = 0.4
_MATH_FONT = re.compile(r"cmmi|cmsy|cmex|cmbsy|msam|msbm|math|symbol|eufm|rsfs|esint|stmary|wasy|mnsymbol|"
                        r"lmmono.*math|cambria math|mt ?extra|euler", re.I)
CAPTION = re.compile(r"^\s*(figure|fig\.|table|tab\.|listing|algorithm|scheme|chart)\s*([\dIVX]+|[A-Z])(\.\d+)*\s*[:.|\u2013\u2014]",
                      re.I)
BULLET = re.compile(r"^\s*([\u2022\u25e6\u25aa\u25cf\u25cb\u2023\u2043\u2219\u00b7\u2013\u2014\u25a0\u25a1\u27a2\u2192\u22c4*\-]"
                     r"|\(?\d{1,2}[.)]\s|\(?[a-h][.)]\s|\(?(i|ii|iii|iv|v|vi|vii|viii|ix|x)[.)]\s)")
_EQ_NUMBER = re.compile(r"^\(\s*\d+(\.\d+)*[a-z]?\s*\)$")
_EQ_NUMBER_END = re.compile(r"\(\s*\d+(\.\d+)*[a-z]?\s*\)$")
_MONO_FONT = re.compile(r"cmtt|sfmono|mono|courier|typewriter|lmtt|inconsolata|\btt", re.I)
_FOOT_MARK = re.compile(r"^\s*([\d*\u2020\u2021\u00a7\u00b6]|\u2217)")


def union_box(rects) -> list[float]:
    rects = list(rects)
    return [min(r[0] for r in rects), min(r[1] for r in rects), max(r[2] for r in rects), max(r[3] for r in rects)]


def centre_inside(inner, outer, tol: float = 2.0) -> bool:
    cx, cy = (inner[0] + inner[2]) / 2, (inner[1] + inner[3]) / 2
    return outer[0] - tol <= cx <= outer[2] + tol and outer[1] - tol <= cy <= outer[3] + tol


def _area(r) -> float:
    return max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])


def text_lines(block: dict) -> list[dict]:
    """The non-empty lines of a pymupdf text block: text, bbox, chars per font size / math / bold."""
    out = []
    for line in block.get("lines", []):
        spans = [s for s in line.get("spans", []) if s.get("text", "").strip()]
        if not spans:
            continue
        text = " ".join(" ".join(s["text"].split()) for s in spans)
        out.append({"text": text, "bbox": list(line["bbox"]), "spans": spans})
    return out


def block_stats(lines: list[dict]) -> dict:
    sizes, n, math, bold, mono = Counter(), 0, 0, 0, 0
    for line in lines:
        for s in line["spans"]:
            k = len(s["text"].strip())
            n += k
            sizes[round(s["size"] * 2) / 2] += k
            math += k if _MATH_FONT.search(s.get("font", "")) else 0
            bold += k if (s.get("flags", 0) & 16 or "bold" in s.get("font", "").lower()) else 0
            mono += k if (s.get("flags", 0) & 8 or _MONO_FONT.search(s.get("font", ""))) else 0
    size = sizes.most_common(1)[0][0] if sizes else 0.0
    first = lines[0]["spans"][0] if lines else {}
    return {"chars": max(n, 1), "size": size, "math": math / max(n, 1), "bold": bold / max(n, 1), "mono": mono / max(n, 1),
            "superscript_start": bool(first.get("flags", 0) & 1)}


def st_rows(lines: list[dict]) -> int:
    """Visual lines of a block: pymupdf makes a separate 'line' of each piece on one baseline."""
    centres = sorted((ln["bbox"][1] + ln["bbox"][3]) / 2 for ln in lines)
    return sum(1 for i, c in enumerate(centres) if i == 0 or c - centres[i - 1] > 2.0)


def body_size(blocks: list[dict]) -> float:
    counts = Counter()
    for b in blocks:
        for line in b["lines"]:
            for s in line["spans"]:
                counts[round(s["size"] * 2) / 2] += len(s["text"].strip())
    return counts.most_common(1)[0][0] if counts else 10.0


def classify_text(block: dict, body: float, page_w: float, page_h: float, first_page: bool) -> str:
    """DocLayNet class of one text block (see the module docstring for the rules)."""
    st, text, n_lines = block["stats"], block["text"], st_rows(block["lines"])
    x0, y0, x1, y1 = block["bbox"]
    short = n_lines <= 2 and len(text) <= 80 and st["size"] <= body * 1.1
    if short and (y1 <= page_h * MARGIN_BAND or block.get("margin") == "top"):
        return "Page-header"
    if short and (y0 >= page_h * (1 - MARGIN_BAND) or block.get("margin") == "bottom"):
        return "Page-footer"
    if CAPTION.match(text):
        return "Caption"
    eq_line = any(_EQ_NUMBER_END.search(ln["text"]) for ln in block["lines"])
    if st["math"] >= MATH_SHARE or _EQ_NUMBER.match(text) or (st["math"] >= 0.15 and eq_line):
        return "Formula"
    if first_page and st["size"] >= body * 1.25 and y1 <= page_h * 0.45 and block.get("largest"):
        return "Title"
    if n_lines <= 3 and len(text) <= 160 and (st["size"] >= body * 1.12 or (st["bold"] >= 0.8 and n_lines <= 2)):
        return "Section-header"
    if st["size"] <= body * 0.92 and y0 >= page_h * 0.65 and st["mono"] < 0.25 and \
            (st["superscript_start"] or _FOOT_MARK.match(text)):
        return "Footnote"
    if BULLET.match(text):
        return "List-item"
    return "Text"


def split_list_items(lines: list[dict]) -> list[list[dict]]:
    """Lines of one block -> one group per list item (a new item starts at a bullet/number line)."""
    groups: list[list[dict]] = []
    for line in lines:
        if not groups or BULLET.match(line["text"]):
            groups.append([line])
        else:
            groups[-1].append(line)
    return groups


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


def find_tables(drawings: list[dict], lines: list[dict], page_h: float) -> list[list[float]]:
    """Table regions from stacked horizontal rules that enclose columnar text."""
    rules, tables, used = horizontal_rules(drawings), [], set()
    for i, r in enumerate(rules):
        if i in used:
            continue
        group = [r]
        for j in range(i + 1, len(rules)):
            s = rules[j]
            if abs(s[0] - r[0]) < 4 and abs(s[2] - r[2]) < 4 and s[1] - group[-1][3] < page_h * 0.4:
                if s[1] - group[-1][1] > 3:  # a double rule counts once
                    group.append(s)
                used.add(j)
        region = union_box(group)
        if len(group) >= 2 and _columns_inside(region, lines):
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


def _near(a, b, dy: float, dx: float) -> bool:
    return a[1] - dy <= b[3] and b[1] - dy <= a[3] and a[0] - dx <= b[2] and b[0] - dx <= a[2]


def merge_formulas(regions: list[dict], body: float) -> list[dict]:
    """Merge the pieces of display math (see the module docstring) into one Formula region each."""
    def piece(r):
        short = len(r["text"]) <= 40 and r["bbox"][3] - r["bbox"][1] <= 2.5 * body
        return r["category"] == "Formula" or (r["category"] == "Text" and short)
    cand = [i for i, r in enumerate(regions) if piece(r)]
    parent = {i: i for i in cand}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for a_i, a in enumerate(cand):
        for b in cand[a_i + 1:]:
            if _near(regions[a]["bbox"], regions[b]["bbox"], 0.8 * body, 3 * body):
                parent[find(a)] = find(b)
    groups: dict[int, list[int]] = {}
    for i in cand:
        groups.setdefault(find(i), []).append(i)
    out, done = [], set()
    for i, r in enumerate(regions):
        if i in done:
            continue
        g = groups.get(find(i)) if i in parent else None
        if g and len(g) > 1 and any(regions[j]["category"] == "Formula" for j in g):
            parts = sorted((regions[j] for j in g), key=lambda q: (q["bbox"][1], q["bbox"][0]))
            out.append({"category": "Formula", "bbox": union_box(q["bbox"] for q in parts),
                        "text": " ".join(q["text"] for q in parts)})
            done.update(g)
        else:
            out.append(r)
    return out


def mark_margins(blocks: list[dict], body: float, page_h: float) -> None:
    """Set ``block["margin"]`` to "top"/"bottom" on the isolated first/last block (module docstring)."""
    if len(blocks) < 2:
        return
    top = min(blocks, key=lambda b: b["bbox"][1])
    below = min(b["bbox"][1] for b in blocks if b is not top)
    if top["bbox"][3] <= 0.16 * page_h and below - top["bbox"][3] >= 1.5 * body:
        top["margin"] = "top"
    bottom = max(blocks, key=lambda b: b["bbox"][3])
    above = max(b["bbox"][3] for b in blocks if b is not bottom)
    if bottom is not top and bottom["bbox"][1] >= 0.84 * page_h and bottom["bbox"][1] - above >= 1.5 * body:
        bottom["margin"] = "bottom"


def demote_footnotes(regions: list[dict]) -> None:
    """A Footnote with body content below it in its column is ordinary small text."""
    for r in regions:
        if r["category"] != "Footnote":
            continue
        x0, _, x1, y1 = r["bbox"]
        for q in regions:
            qb = q["bbox"]
            if q["category"] not in ("Footnote", "Page-footer", "Page-header") and qb[1] >= y1 - 1 \
                    and qb[0] < x1 and x0 < qb[2]:
                r["category"] = "Text"
                break
