"""The report section of ``gsdistill demo --coco``: whose pages, which split, which classes, what OCR read,
and how large the labelled zones are where the detectors see them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def zone_sizes(data_yaml: str | Path, imgsz: int) -> dict[str, tuple[float, float, int]]:
    """Per class: median box width and height in pixels of the ``imgsz`` image the detectors read (long side
    scaled to ``imgsz``), and the box count, over both sides of the detection data."""
    out: dict[str, list] = {}
    for split in ("train", "val"):
        coco = json.loads((Path(data_yaml).parent / "coco" / f"{split}.json").read_text())
        names = {c["id"]: c["name"] for c in coco["categories"]}
        scale = {im["id"]: imgsz / max(im["width"], im["height"]) for im in coco["images"]}
        for a in coco["annotations"]:
            s = scale[a["image_id"]]
            out.setdefault(names[a["category_id"]], []).append((a["bbox"][2] * s, a["bbox"][3] * s))
    return {k: (float(np.median([w for w, _ in v])), float(np.median([h for _, h in v])), len(v)) for k, v in out.items()}


def _greek(c: str) -> bool:
    return 0x370 <= ord(c) <= 0x3FF or 0x1F00 <= ord(c) <= 0x1FFF


def ocr_by_document(pages) -> list[str]:
    """What OCR read of each document: pages, median words a page, and the share of its letters that are Greek
    (U+0370-03FF, U+1F00-1FFF) or outside ASCII Latin (umlauts, long s, ...): a book whose Greek reads as Latin
    letters shows a 0 % Greek share."""
    by_doc: dict[str, list[str]] = {}
    for p in pages:
        by_doc.setdefault(str(p.get("doc_id") or p["id"]), []).append(" ".join(s["text"] for s in p["spans"]))
    lines = ["| document | pages | words a page (median) | Greek letters | other non-ASCII letters |",
             "|---|---:|---:|---:|---:|"]
    for doc, texts in sorted(by_doc.items()):
        letters = [c for c in " ".join(texts) if c.isalpha()]
        greek = sum(map(_greek, letters)) / max(1, len(letters))
        other = sum(ord(c) > 127 and not _greek(c) for c in letters) / max(1, len(letters))
        lines.append(f"| {doc} | {len(texts)} | {np.median([len(t.split()) for t in texts]):.0f} | {100 * greek:.1f} % "
                     f"| {100 * other:.1f} % |")
    return lines


def labelled_section(lab: dict | None, imgsz: int | None = None, fractions=(), pages=()) -> list[str]:
    if not lab:
        return []
    docs, held = lab["documents"], lab["held_docs"]
    ocr = lab["ocr"]
    lines = ["## 1b. The labelled pages", "",
             f"Labels: {', '.join(f'`{j}` (images in `{d}`)' for j, d in lab['inputs'])}; {lab['images']} pages of "
             f"{len(docs)} documents, found by {lab['documents_by']}. Pretraining read these pages as unlabelled scans "
             "(their image files only, OCR for the text); the boxes trained the detection heads and scored them.", "",
             f"- **Split by document, never by page**: held out, {len(held)} of {len(docs)} documents: "
             + ", ".join(f"{d} ({docs[d]} pages)" for d in held) + "; pretraining and detection training: "
             + ", ".join(f"{d} ({docs[d]} pages)" for d in lab["train_docs"]) + ".",
             f"- **Classes** ({lab['class_map']}): " + ", ".join(f"{c} {n}" for c, n in lab["boxes"].items())
             + " boxes." + (" Merged: " + "; ".join(f"{t} ← {', '.join(s)}" for t, s in lab["merged"].items()) + "."
                            if lab["merged"] else "")]
    if lab["dropped"]:
        lines.append(f"- **Too rare to score** (fewer than {lab['min_class_boxes']} boxes, `labelled.min_class_boxes`; "
                     "left out of detection, their regions count as background): "
                     + ", ".join(f"{c} ({n} boxes)" for c, n in lab["dropped"].items()) + ".")
    if lab["unmapped"]:
        lines.append("- Dropped by the class map: " + ", ".join(lab["unmapped"]) + ".")
    s = ocr["settings"]
    lines.append(f"- **OCR** (Tesseract `{s['lang']}`, scans downscaled to a long side of {s['long_side'] or 'as is'} px, "
                 f"{ocr['workers']} workers): {ocr['pages']} pages, {ocr['spans']} text paragraphs, {ocr['skipped']} "
                 f"skipped; {'found in the cache' if ocr['cached'] else 'built'}: OCR {ocr['ocr_seconds']:.0f} s, "
                 f"copies {ocr['copy_seconds']:.0f} s (cache `{ocr['folder']}`).")
    lines.append(f"- Intervals resample held-out **{lab['bootstrap_unit']}** (documents when there are at least "
                 "`labelled.bootstrap_min_docs` of them)"
                 + (f"; the low-label rows train on a seeded share of the training **pages** "
                    f"({', '.join(f'{100 * f:g} %' for f in fractions)})" if fractions else "") + ".")
    if lab["input_skipped"]:
        lines.append(f"- Skipped inputs: {len(lab['input_skipped'])} (first: {lab['input_skipped'][0]['source']}: "
                     f"{lab['input_skipped'][0]['reason']}).")
    if pages:
        lines += ["", "What OCR read of each document (pretraining's text; the held-out documents' pages only serve "
                  "retrieval and this report):", ""] + ocr_by_document(pages)
    if imgsz:
        sizes = zone_sizes(lab["data_yaml"], imgsz)
        lines += ["", f"Where the detectors see the zones: median box width × height in pixels of the {imgsz} px "
                  "page they read (YOLOv10's strides are 8, 16 and 32 px; the ViT's patches 16 px):", "",
                  "| class | boxes | width px | height px |", "|---|---:|---:|---:|"]
        lines += [f"| {c} | {n} | {w:.1f} | {h:.1f} |" for c, (w, h, n) in sizes.items()]
    return lines + [""]
