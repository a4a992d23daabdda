"""DocBank token files -> page tuples with region boxes and spans.

A DocBank page is ``<name>_<page>.txt`` (one token per line: ``token x0 y0 x1 y1 R G B font label``,
tab-separated, boxes in 0..1000 of the page) with its render ``<name>_<page>_ori.jpg``; images are
found anywhere under ``root`` (official ``DocBank_500K_ori_img/`` or the samples' ``images/``).

Tokens come in the PDF's text order. They are grouped in two steps:

1. **lines**: a token continues the current line when it has the same label, its vertical centre
   lies within the line's height and it is at most 1.2 token heights right of the line's end (a word gap is ~0.3)
   (further is a column gutter or a table cell); pseudo-tokens such as ``##LTLine##`` (rules)
   extend a line's box without adding text;
2. **regions**: a line joins one of the 8 latest regions of the same label when it overlaps the
   region horizontally by half its width (same column) and starts at most ``gap`` line-heights below it (1.2 for text,
   2.5 for tables and equations, whose rows are further apart) or overlaps it vertically. A
   ``reference`` or ``list`` line that starts a new entry ("[12]", "3.", a bullet) opens a new
   region, because DocLayNet boxes each list item / reference on its own.
3. **pieces**: DocBank cuts tables and display math into pieces side by side on a row (cells,
   operators) that never overlap horizontally. Regions of one ``table`` / ``equation`` label closer
   than (4, 1.2) / (2, 0.8) median token heights (x, y) are merged, so are ``section`` / ``caption``
   / ``title`` pieces on one row less than 2.2 apart ("I." + "INTRODUCTION") and ``figure`` regions
   that intersect; a region of any other label mostly (half the smaller box) inside another of the same
   label, or of another label that also maps to Text ("Abstract." inside its abstract), joins it;
   an equation region of only equation numbers ("(3.12)") joins the equation on its row, as
   DocLayNet's Formula box includes the number. Regions of text labels without words (a lone
   rule) are dropped.

``##LTFigure##`` pseudo-tokens are figure boxes; regions whose centre lies inside a figure (tick
labels, legends - DocBank often labels them paragraph) are absorbed into it, text included. Labels map onto DocLayNet's classes
with ``labels.DOCBANK_TO_DOCLAYNET`` (DocBank's "footer" holds footnotes: Footnote). Each region with text is one span (its tokens joined),
in the order of its first token. ``doc_id`` is the arXiv id found in the name (else the name
without the page number). Empty files, files without one valid token line and pages without an
image are recorded skips; malformed lines inside a good file are counted and recorded.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from gsdistill.tuples.errors import DataError, SkipLog, ensure_log
from gsdistill.tuples.sources.images import load_image
from gsdistill.tuples.labels import DOCBANK_CLASSES, to_doclaynet
from gsdistill.tuples.sources.pdf_layout import BULLET, centre_inside, union_box

FIGURE_TOKEN = "##LTFigure##"
_PSEUDO = re.compile(r"^##LT\w+##$")
_ENTRY_START = re.compile(r"^\s*(\[\d+\]|\d{1,3}\.\s)")
_ARXIV_ID = re.compile(r"(\d{4}\.\d{4,5})")
_FOOTNOTE_START = re.compile(r"^\s*(\d{1,2}|[*\u2020\u2021\u00a7\u00b6\u2217])(?=\s|$|[A-Z])")  # "6 The", "6The"
# a caption's "Table 2:" / "Fig. 5." / "TABLE V" prefix alone (DocBank labels it paragraph)
_CAPTION_PREFIX = re.compile(r"^\s*(?i:figure|fig\.?|table|tab\.|algorithm|listing)\s*(\d+|[IVXL]+|[A-Z]\d*)(\.\d+)*\s*[:.]?\s*$")
_GAP = {"table": 2.5, "equation": 2.5}


def parse_tokens(path: Path) -> tuple[list[dict], int, int]:
    """(tokens with 0..1000 boxes, malformed line count, total non-empty lines)."""
    tokens, bad, total = [], 0, 0
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not raw.strip():
            continue
        total += 1
        f = raw.rstrip("\r").split("\t")
        if len(f) != 10 or f[9].strip() not in DOCBANK_CLASSES:
            bad += 1
            continue
        try:
            box = [float(v) for v in f[1:5]]
        except ValueError:
            bad += 1
            continue
        box = [min(max(v, 0.0), 1000.0) for v in box]
        if box[2] < box[0] or box[3] < box[1]:
            bad += 1
            continue
        tokens.append({"text": f[0].strip(), "bbox": box, "label": f[9].strip()})
    return tokens, bad, total


def _lines(tokens: list[dict]) -> list[dict]:
    lines: list[dict] = []
    for t in tokens:
        if t["text"] == FIGURE_TOKEN or not t["text"]:
            continue
        # other pseudo-tokens (##LTLine##: a table rule) extend their region but carry no text
        word = "" if _PSEUDO.match(t["text"]) else t["text"]
        if lines:
            cur = lines[-1]
            b, lb = t["bbox"], cur["bbox"]
            h = max(b[3] - b[1], 1e-3)  # this token's height: a grown line box would overstate it
            cy = (b[1] + b[3]) / 2
            if cur["label"] == t["label"] and lb[1] - 0.2 * h <= cy <= lb[3] + 0.2 * h and lb[2] - h <= b[0] <= lb[2] + 1.2 * h:
                cur["tokens"].append(word)
                cur["bbox"] = union_box([lb, b])
                continue
        lines.append({"label": t["label"], "bbox": list(t["bbox"]), "tokens": [word]})
    return lines


def _joins(region: dict, line: dict, text: str, unit: float) -> bool:
    """May ``line`` extend ``region`` (same label, same column, right below or beside it)?"""
    if region["label"] != line["label"]:
        return False
    rb, b = region["bbox"], line["bbox"]
    h = min(max(b[3] - b[1], 1e-3), 1.5 * unit)  # a tall integral sign must not stretch the allowed gap
    overlap = min(rb[2], b[2]) - max(rb[0], b[0])
    same_col = overlap >= 0.5 * min(b[2] - b[0], rb[2] - rb[0])
    close = -h <= b[1] - rb[3] <= _GAP.get(line["label"], 1.2) * h or (b[1] < rb[3] and b[3] > rb[1])
    new_entry = line["label"] in ("reference", "list") and (_ENTRY_START.match(text) or BULLET.match(text)) or \
        line["label"] == "footer" and _FOOTNOTE_START.match(text)
    # a paragraph's first line is indented: a new row starting 0.8-4 token heights right of the region
    indented = line["label"] in ("paragraph", "abstract") and b[1] >= rb[3] - 0.3 * h and \
        rb[0] + 0.8 * h < b[0] < rb[0] + 4 * h
    return same_col and close and not new_entry and not indented


def _regions(lines: list[dict], unit: float) -> list[dict]:
    """Lines -> regions; a line may continue any of the last 8 regions (DocBank's token order
    sometimes alternates between the two columns line by line)."""
    regions: list[dict] = []
    for ln in lines:
        text = " ".join(w for w in ln["tokens"] if w)
        host = next((r for r in reversed(regions[-8:]) if _joins(r, ln, text, unit)), None)
        if host is not None:
            host["bbox"] = union_box([host["bbox"], ln["bbox"]])
            host["text"] = (host["text"] + " " + text).strip()
        else:
            regions.append({"label": ln["label"], "bbox": list(ln["bbox"]), "text": text})
    return regions


# Same-label regions closer than these (x, y) gaps, in median token heights, are one region: table
# cells and display-math pieces sit side by side on a row (no horizontal overlap) and rules are
# zero-height boxes touching the row below.
_PIECE_GAP = {"table": (4.0, 1.2), "equation": (2.0, 0.8), "figure": (0.0, 0.0),
              # "I." + "INTRODUCTION", "Table 2:" + its text: one row, a word gap apart (a column
              # gutter is wider than 2.2 token heights)
              "section": (2.2, 0.0), "caption": (2.2, 0.0), "title": (2.2, 0.0)}
_EQ_NUMBER = re.compile(r"^(\(\s*[\dA-Za-z]{1,3}(\.\d+)*[a-z]?\s*\)\s*)+$")  # "(3.12)", stacked "(1) (2)"


def _mergeable(a: dict, b: dict, unit: float) -> bool:
    ab, bb = a["bbox"], b["bbox"]
    if a["label"] != b["label"]:
        # a run-in "Abstract." (paragraph) inside its abstract: both DocLayNet Text, one box
        same_class = to_doclaynet(a["label"], "docbank") == to_doclaynet(b["label"], "docbank") == "Text"
        return same_class and (centre_inside(ab, bb, tol=0.5) or centre_inside(bb, ab, tol=0.5)) and \
            _mostly_inside(ab, bb)
    if a["label"] in _PIECE_GAP:
        gx, gy = (g * unit for g in _PIECE_GAP[a["label"]])
        return ab[0] - gx <= bb[2] and bb[0] - gx <= ab[2] and ab[1] - gy <= bb[3] and bb[1] - gy <= ab[3]
    return _mostly_inside(ab, bb)  # other labels: a piece DocBank's token order split off


def _mostly_inside(ab, bb) -> bool:
    """Half the smaller box lies inside the larger one (or a zero-height box's centre does)."""
    iw = min(ab[2], bb[2]) - max(ab[0], bb[0])
    ih = min(ab[3], bb[3]) - max(ab[1], bb[1])
    smaller = min((ab[2] - ab[0]) * (ab[3] - ab[1]), (bb[2] - bb[0]) * (bb[3] - bb[1]))
    if smaller <= 0:  # a rule or a dot (zero-height pseudo-token region) inside the other
        return centre_inside(ab, bb, tol=0.5) or centre_inside(bb, ab, tol=0.5)
    return iw > 0 and ih > 0 and iw * ih >= 0.5 * smaller


def _merge_pieces(regions: list[dict], unit: float) -> list[dict]:
    """Merge regions that ``_mergeable`` joins (kept in first-piece order), repeated until stable."""
    while True:
        out: list[dict] = []
        for r in regions:
            host = next((o for o in out if _mergeable(o, r, unit)), None)
            if host is None:
                out.append(dict(r))
            else:
                host["bbox"] = union_box([host["bbox"], r["bbox"]])
                host["text"] = (host["text"] + " " + r["text"]).strip()
        if len(out) == len(regions):
            return out
        regions = out


def _relabel_generated_text(regions: list[dict], unit: float) -> None:
    """LaTeX's generated text comes labelled paragraph in DocBank: the "Table 2:" before a caption
    and the "(3)" beside an equation. They are part of the Caption / Formula in DocLayNet."""
    for r in regions:
        if r["label"] != "paragraph":
            continue
        b = r["bbox"]
        if _CAPTION_PREFIX.match(r["text"]):
            host = next((c for c in regions if c["label"] == "caption" and (
                _same_row(b, c["bbox"]) and -unit <= c["bbox"][0] - b[2] <= 2 * unit
                or -unit <= c["bbox"][1] - b[3] <= 1.5 * unit and min(b[2], c["bbox"][2]) > max(b[0], c["bbox"][0]))), None)
            if host is not None:
                r["label"] = "caption"
        elif _EQ_NUMBER.match(r["text"]) and any(o["label"] == "equation" and _same_row(b, o["bbox"]) for o in regions):
            r["label"] = "equation"


def _same_row(a, b) -> bool:
    return min(a[3], b[3]) - max(a[1], b[1]) > 0.3 * min(a[3] - a[1], b[3] - b[1])


def _attach_equation_numbers(regions: list[dict]) -> list[dict]:
    """An equation region holding only equation numbers ("(3.12)", or a stack of them) joins the
    equation beside it (DocLayNet's Formula box includes the number; the PDF builder does the same)."""
    out = []
    for r in regions:
        b = r["bbox"]
        if r["label"] == "equation" and _EQ_NUMBER.match(r["text"]):
            row = [o for o in regions if o is not r and o["label"] == "equation" and not _EQ_NUMBER.match(o["text"])
                   and min(o["bbox"][3], b[3]) - max(o["bbox"][1], b[1]) > 0.3 * (b[3] - b[1])]
            if row:
                host = max(row, key=lambda o: min(o["bbox"][3], b[3]) - max(o["bbox"][1], b[1]))
                host["bbox"] = union_box([host["bbox"], b])
                host["text"] = (host["text"] + " " + r["text"]).strip()
                continue
        out.append(r)
    return out


def group_tokens(tokens: list[dict]) -> list[dict]:
    """Tokens (0..1000 boxes, file order) -> regions ``{label, bbox, text}`` in reading order."""
    figures = [{"label": "figure", "bbox": list(t["bbox"]), "text": ""} for t in tokens if t["text"] == FIGURE_TOKEN]
    heights = sorted(t["bbox"][3] - t["bbox"][1] for t in tokens if t["text"] and not _PSEUDO.match(t["text"]))
    unit = max(heights[len(heights) // 2], 1.0) if heights else 10.0  # median token height
    regions = _merge_pieces(_regions(_lines(tokens), unit) + figures, unit)
    _relabel_generated_text(regions, unit)
    regions = _merge_pieces(_attach_equation_numbers(_merge_pieces(regions, unit)), unit)
    # a text label's region without any word (a lone rule) is no layout region
    regions = [r for r in regions if r["text"] or r["label"] in ("table", "figure")]
    figs = [r for r in regions if r["label"] == "figure"]
    out = []
    for r in regions:
        host = next((f for f in figs if r is not f and centre_inside(r["bbox"], f["bbox"])), None)
        if host is None:
            out.append(r)
        else:  # tick labels and legends inside a figure (DocBank often labels them paragraph)
            host["text"] = (host["text"] + " " + r["text"]).strip()
    return out


def doc_id_of(stem: str) -> str:
    m = _ARXIV_ID.search(stem)
    return m.group(1) if m else stem.rsplit("_", 1)[0]


def _image_index(root: Path) -> dict[str, Path]:
    index = {}
    for p in sorted(root.rglob("*_ori.*")):
        if p.suffix.lower() in (".jpg", ".jpeg", ".png"):
            index.setdefault(p.name.rsplit("_ori.", 1)[0], p)
    return index


def docbank_pages(root: str | Path, skips: SkipLog | None = None, images_dir: str | Path | None = None,
                  max_pixels: int = 100_000_000, image_index: dict[str, Path] | None = None) -> Iterator[dict]:
    """Page tuples of every DocBank token file under ``root`` (or of one ``.txt`` file), sorted by name.
    ``image_index`` (token-file stem -> image) replaces the search for images (a parallel build looks
    them up once, not once per page)."""
    root, skips = Path(root), ensure_log(skips)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.txt") if not p.name.startswith("labels"))
    base = Path(images_dir) if images_dir else (root.parent if root.is_file() else root)
    images = _image_index(base) if image_index is None else image_index
    if root.is_file() and not images and image_index is None:
        images = _image_index(base.parent)
    for path in files:
        tokens, bad, total = parse_tokens(path)
        if total == 0:
            skips.add(str(path), "empty annotation file")
            continue
        if not tokens:
            skips.add(str(path), f"no valid token line: {bad} malformed lines")
            continue
        if bad:
            skips.add(str(path), f"malformed lines: {bad} of {total} skipped")
        if path.stem not in images:
            skips.add(str(path), f"missing image: no {path.stem}_ori.jpg under {base}")
            continue
        try:
            image = load_image(images[path.stem], max_pixels)[0]
        except DataError as e:
            skips.add(str(path), f"unreadable image: {e}")
            continue
        w, h = image.size
        sx, sy = w / 1000.0, h / 1000.0
        spans, boxes = [], []
        for r in group_tokens(tokens):
            b = r["bbox"]
            bbox = [round(b[0] * sx, 2), round(b[1] * sy, 2), round(b[2] * sx, 2), round(b[3] * sy, 2)]
            # a one-token region can be thinner than a pixel (a dot, a rule): widen it to 1 px
            bbox[2], bbox[3] = min(max(bbox[2], bbox[0] + 1), w), min(max(bbox[3], bbox[1] + 1), h)
            bbox[0], bbox[1] = min(bbox[0], bbox[2] - 1), min(bbox[1], bbox[3] - 1)
            cat = to_doclaynet(r["label"], "docbank")
            boxes.append({"category": cat, "bbox": bbox})
            if r["text"].strip():
                spans.append({"text": r["text"].strip(), "bbox": bbox, "category": cat})
        if not spans:
            skips.add(str(path), "no text: only figure tokens")
            continue
        yield {"id": f"docbank-{path.stem}", "image": image, "width": w, "height": h, "spans": spans,
               "boxes": boxes, "source": "docbank", "doc_id": doc_id_of(path.stem)}
