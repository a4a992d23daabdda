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
   region, because DocLayNet boxes each list item / reference on its own. Afterwards intersecting
   regions of a table, equation or figure label are merged (DocBank cuts them into pieces).

``##LTFigure##`` pseudo-tokens are figure boxes; regions whose centre lies inside a figure (tick
labels, legends - DocBank often labels them paragraph) are absorbed into it, text included. Labels map onto DocLayNet's classes
with ``labels.DOCBANK_TO_DOCLAYNET``. Each region with text is one span (its tokens joined),
in the order of its first token. ``doc_id`` is the arXiv id found in the name (else the name
without the page number). Empty files, files without one valid token line and pages without an
image are recorded skips; malformed lines inside a good file are counted and recorded.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from gsdistill.data.errors import DataError, SkipLog, ensure_log
from gsdistill.data.images import load_image
from gsdistill.data.labels import DOCBANK_CLASSES, to_doclaynet
from gsdistill.data.pdf_layout import BULLET, centre_inside, union_box

FIGURE_TOKEN = "##LTFigure##"
_PSEUDO = re.compile(r"^##LT\w+##$")
_ENTRY_START = re.compile(r"^\s*(\[\d+\]|\d{1,3}\.\s)")
_ARXIV_ID = re.compile(r"(\d{4}\.\d{4,5})")
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


def _joins(region: dict, line: dict, text: str) -> bool:
    """May ``line`` extend ``region`` (same label, same column, right below or beside it)?"""
    if region["label"] != line["label"]:
        return False
    rb, b = region["bbox"], line["bbox"]
    h = max(b[3] - b[1], 1e-3)
    overlap = min(rb[2], b[2]) - max(rb[0], b[0])
    same_col = overlap >= 0.5 * min(b[2] - b[0], rb[2] - rb[0])
    close = -h <= b[1] - rb[3] <= _GAP.get(line["label"], 1.2) * h or (b[1] < rb[3] and b[3] > rb[1])
    new_entry = line["label"] in ("reference", "list") and (_ENTRY_START.match(text) or BULLET.match(text))
    return same_col and close and not new_entry


def _regions(lines: list[dict]) -> list[dict]:
    """Lines -> regions; a line may continue any of the last 8 regions (DocBank's token order
    sometimes alternates between the two columns line by line)."""
    regions: list[dict] = []
    for ln in lines:
        text = " ".join(w for w in ln["tokens"] if w)
        host = next((r for r in reversed(regions[-8:]) if _joins(r, ln, text)), None)
        if host is not None:
            host["bbox"] = union_box([host["bbox"], ln["bbox"]])
            host["text"] = (host["text"] + " " + text).strip()
        else:
            regions.append({"label": ln["label"], "bbox": list(ln["bbox"]), "text": text})
    return regions


def _merge_pieces(regions: list[dict]) -> list[dict]:
    """Merge intersecting regions of the same table/equation/figure label (kept in first-piece order),
    repeated until no two of them intersect."""
    while True:
        merged = _merge_once(regions)
        if len(merged) == len(regions):
            return merged
        regions = merged


def _merge_once(regions: list[dict]) -> list[dict]:
    out: list[dict] = []
    for r in regions:
        host = None
        if r["label"] in ("table", "equation", "figure"):
            host = next((o for o in out if o["label"] == r["label"] and o["bbox"][0] < r["bbox"][2]
                         and r["bbox"][0] < o["bbox"][2] and o["bbox"][1] < r["bbox"][3] and r["bbox"][1] < o["bbox"][3]), None)
        if host is None:
            out.append(dict(r))
        else:
            host["bbox"] = union_box([host["bbox"], r["bbox"]])
            host["text"] = (host["text"] + " " + r["text"]).strip()
    return out


def group_tokens(tokens: list[dict]) -> list[dict]:
    """Tokens (0..1000 boxes, file order) -> regions ``{label, bbox, text}`` in reading order."""
    figures = [{"label": "figure", "bbox": list(t["bbox"]), "text": ""} for t in tokens if t["text"] == FIGURE_TOKEN]
    regions = _merge_pieces(_regions(_lines(tokens)) + figures)
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
                  max_pixels: int = 100_000_000) -> Iterator[dict]:
    """Page tuples of every DocBank token file under ``root`` (or of one ``.txt`` file), sorted by name."""
    root, skips = Path(root), ensure_log(skips)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.txt") if not p.name.startswith("labels"))
    base = Path(images_dir) if images_dir else (root.parent if root.is_file() else root)
    images = _image_index(base)
    if root.is_file() and not images:
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
