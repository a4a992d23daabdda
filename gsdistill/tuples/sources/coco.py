"""COCO layout sets (DocLayNet, PubLayNet) -> page tuples.

Official layouts understood (``images_dir`` / ``text_dir`` may always be given explicitly):

* DocLayNet core: ``COCO/{train,val,test}.json`` + ``PNG/<file_name>``; DocLayNet extra:
  ``JSON/<page stem>.json`` with ``{"cells": [{"bbox": [x, y, w, h], "text": ...}, ...]}`` in the
  PNG's pixels. ``JSON/`` is looked up beside ``COCO/`` and beside the json.
* PubLayNet: ``{train,val}.json`` + ``{train,val}/<file_name>``; also ``<json dir>/images/``.

Text: DocLayNet's cells become the page's spans where the JSON file exists. PubLayNet (and
DocLayNet without its extra) has no text: when ``ocr_fn`` is given the page is OCRed (the default
config does so, Tesseract), otherwise the page is recorded as skipped "no text" - a page tuple
needs spans for the semantic positives, and a page without them would only be dropped later.
Text pieces (cells or OCR paragraphs) are grouped by the annotated box holding their centre: one
span per box with text, class = the box's class, in the order of the first piece (the PDF's text
order for cells, Tesseract's for OCR); pieces outside every box are spans of their own (class None).

Bad annotations are recorded in ``skips`` and the rest of the page is kept: an unknown class
(dropped), an ``image_id`` missing from ``images`` (dropped), a box of negative width or height
(dropped: never flipped, the intended corner is unknown) or zero size (dropped), a box partly
outside the page (clipped to the page, recorded as "box clipped"), a box wholly outside (dropped). A missing or unreadable image
skips its page; a json that cannot be parsed raises ``DataError``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Iterator

from gsdistill.tuples.errors import DataError, SkipLog, ensure_log
from gsdistill.tuples.sources.images import load_image
from gsdistill.tuples.labels import DOCLAYNET_CLASSES, PUBLAYNET_CLASSES, to_doclaynet


def read_coco(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: unreadable COCO json ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or not {"images", "annotations", "categories"} <= data.keys():
        raise DataError(f"{path}: not a COCO detection json (needs 'images', 'annotations', 'categories')")
    return data


def detect_source(categories: list[dict]) -> str:
    """'publaynet' when more category names are PubLayNet's (lower-case "text", "figure", ...) than
    DocLayNet's ("Text", "Picture", ...), else 'doclaynet'. A stray unknown class does not flip it."""
    names = [str(c.get("name", "")) for c in categories]
    pub = sum(n in PUBLAYNET_CLASSES for n in names)
    doc = sum(n in DOCLAYNET_CLASSES for n in names)
    return "publaynet" if pub > doc else "doclaynet"


def _first_existing(candidates: list[Path], name: str) -> Path | None:
    return next((d for d in candidates if (d / name).is_file()), None)


def default_images_dir(json_path: Path, first_file: str) -> Path:
    d = json_path.parent
    cands = [d / json_path.stem, d.parent / "PNG", d / "PNG", d / "images", d]
    return _first_existing(cands, first_file) or cands[0]


def default_text_dir(json_path: Path) -> Path | None:
    for d in (json_path.parent.parent / "JSON", json_path.parent / "JSON"):
        if d.is_dir():
            return d
    return None


def doc_id_of(image_entry: dict, source: str) -> str:
    if image_entry.get("doc_name"):
        return Path(str(image_entry["doc_name"])).stem
    stem = Path(image_entry["file_name"]).stem
    # PubLayNet: PMC<id>_<page>.jpg -> the article id
    return stem.rsplit("_", 1)[0] if source == "publaynet" and "_" in stem else stem


def clip_box(xywh, width: int, height: int) -> tuple[list[float] | None, str | None]:
    """(pixel xyxy clipped to the page, problem) - problem is None, 'clipped', 'invalid', 'negative' or 'outside'."""
    if not isinstance(xywh, (list, tuple)) or len(xywh) != 4 or any(isinstance(v, (bool, str)) for v in xywh):
        return None, "invalid"  # not [x, y, w, h]: 3 numbers, strings, null
    try:
        x, y, w, h = (float(v) for v in xywh)
    except (TypeError, ValueError):
        return None, "invalid"
    if not all(map(math.isfinite, (x, y, w, h))):
        return None, "invalid"
    if w < 0 or h < 0:  # never flipped into a box: which corner was meant is unknown
        return None, "negative"
    if w == 0 or h == 0:
        return None, "invalid"
    box = [x, y, x + w, y + h]
    clipped = [min(max(box[0], 0.0), width), min(max(box[1], 0.0), height),
               min(max(box[2], 0.0), width), min(max(box[3], 0.0), height)]
    if clipped[2] - clipped[0] < 1 or clipped[3] - clipped[1] < 1:
        return None, "outside"
    return [round(v, 2) for v in clipped], ("clipped" if clipped != box else None)


def _scaled(bb, sx: float, sy: float):
    """A COCO ``[x, y, w, h]`` scaled to the image's pixels; anything else (3 numbers, strings, null)
    is returned as it is, for ``clip_box`` to call invalid (recorded with its annotation id)."""
    numbers = isinstance(bb, (list, tuple)) and len(bb) == 4 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in bb)
    return [bb[0] * sx, bb[1] * sy, bb[2] * sx, bb[3] * sy] if numbers else bb


def spans_by_box(pieces: list[dict], boxes: list[dict]) -> list[dict]:
    """Text pieces in reading order -> one span per containing box (see module docstring)."""
    groups: dict[int, dict] = {}
    spans: list[dict] = []
    for p in pieces:
        cx, cy = (p["bbox"][0] + p["bbox"][2]) / 2, (p["bbox"][1] + p["bbox"][3]) / 2
        holders = [i for i, b in enumerate(boxes)
                   if b["bbox"][0] <= cx <= b["bbox"][2] and b["bbox"][1] <= cy <= b["bbox"][3]]
        if not holders:
            spans.append({"text": p["text"], "bbox": list(p["bbox"]), "category": None})
            continue
        i = min(holders, key=lambda k: (boxes[k]["bbox"][2] - boxes[k]["bbox"][0]) * (boxes[k]["bbox"][3] - boxes[k]["bbox"][1]))
        if i in groups:
            groups[i]["text"] += " " + p["text"]
        else:
            groups[i] = {"text": p["text"], "bbox": list(boxes[i]["bbox"]), "category": boxes[i]["category"]}
            spans.append(groups[i])
    return spans


def _cells(text_dir: Path | None, file_name: str, width: int, height: int) -> list[dict] | None:
    if text_dir is None:
        return None
    path = text_dir / (Path(file_name).stem + ".json")
    if not path.is_file():
        return None
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise DataError(f"{path}: unreadable DocLayNet cell file ({type(e).__name__})") from None
    out = []
    for c in cells:
        box, problem = clip_box(c.get("bbox", []), width, height)
        text = " ".join(str(c.get("text", "")).split())
        if box is not None and text:
            out.append({"text": text, "bbox": box})
    return out


def coco_pages(json_path: str | Path, images_dir: str | Path | None = None, text_dir: str | Path | None = None,
               source: str = "auto", ocr_fn: Callable | None = None, skips: SkipLog | None = None,
               max_pixels: int = 100_000_000) -> Iterator[dict]:
    """Page tuples of one COCO json (one per image entry, in the json's order)."""
    json_path, skips = Path(json_path), ensure_log(skips)
    data = read_coco(json_path)
    source = detect_source(data["categories"]) if source == "auto" else source
    cat_names = {c["id"]: str(c.get("name", "")) for c in data["categories"]}
    anns: dict = {}
    known = {entry.get("id") for entry in data["images"]}
    for a in data["annotations"]:
        if a.get("image_id") not in known:
            skips.add(f"{json_path}#ann={a.get('id')}", f"unknown image_id: {a.get('image_id')!r} is not in 'images'")
            continue
        anns.setdefault(a.get("image_id"), []).append(a)
    if not data["images"]:
        return
    img_dir = Path(images_dir) if images_dir else default_images_dir(json_path, data["images"][0]["file_name"])
    txt_dir = Path(text_dir) if text_dir else default_text_dir(json_path)
    for entry in data["images"]:
        where = f"{json_path}#{entry.get('file_name')}"
        path = img_dir / str(entry.get("file_name", ""))
        if not path.is_file():
            skips.add(where, f"missing image: {path}")
            continue
        try:
            image = load_image(path, max_pixels)[0]
        except DataError as e:
            skips.add(where, f"unreadable image: {e}")
            continue
        w, h = image.size
        sx, sy = w / float(entry.get("width") or w), h / float(entry.get("height") or h)
        if abs(sx - 1) > 1e-3 or abs(sy - 1) > 1e-3:
            skips.add(where, f"image size differs from json: {w}x{h} vs {entry.get('width')}x{entry.get('height')}; boxes rescaled")
        boxes = []
        for a in anns.get(entry.get("id"), []):
            name = cat_names.get(a.get("category_id"))
            cat = to_doclaynet(name, source) if name is not None else None
            if cat is None:
                skips.add(f"{where}#ann={a.get('id')}", f"unknown class: {name if name is not None else a.get('category_id')!r}")
                continue
            bb = a.get("bbox", [])
            box, problem = clip_box(_scaled(bb, sx, sy), w, h)
            if problem is not None:
                reason = {"clipped": "box clipped to page", "invalid": "invalid box", "outside": "box outside page",
                          "negative": "negative box size (dropped, not flipped)"}[problem]
                skips.add(f"{where}#ann={a.get('id')}", f"{reason}: {bb}")
            if box is not None:
                boxes.append({"category": cat, "bbox": box})
        try:
            pieces = _cells(txt_dir, entry["file_name"], w, h)
        except DataError as e:
            skips.add(where, f"unreadable text cells: {e}")
            pieces = None
        if pieces is None and ocr_fn is not None:
            from gsdistill.tuples.sources.images import group_words
            pieces = group_words(ocr_fn(image))
        if not pieces:
            skips.add(where, "no text: no text cells" + (" and OCR found none" if ocr_fn else " and OCR disabled"))
            continue
        # the file name as given (relative path, suffix kept): unique within the json by construction
        yield {"id": f"{source}-{Path(entry['file_name']).as_posix()}", "image": image, "width": w, "height": h,
               "spans": spans_by_box(pieces, boxes), "boxes": boxes, "source": source,
               "doc_id": doc_id_of(entry, source)}
