"""Layout data -> the Ultralytics detection layout (images/<split>/, labels/<split>/, data YAML).

Sources: page tuples (synthetic pages, DocBank region boxes, anything ``gsdistill.tuples`` builds;
here) and COCO layout jsons (DocLayNet and PubLayNet releases, any COCO detection file;
:mod:`gsdistill.detect.coco_convert`, re-exported here). Both write through the folder writer of
:mod:`gsdistill.detect.yolo_folder`.

Every output folder also holds
- ``manifest.json``: counts per split and every skipped image/box with its reason (nothing is
  dropped silently);
- ``coco_eval.json``: per split, the COCO json to score against with pycocotools, the map from
  image file stem to that json's image id and the json category id of each class index (page
  tuples also record ``doc_ids``: file stem -> document, for a bootstrap over documents); so
  :func:`gsdistill.detect.evaluate.coco_eval` scores Ultralytics' own predictions against the
  boxes that were trained on (``coco/<split>.json``: clipped to the image like the labels).
Images are symlinked from the source (copied where links are impossible), never re-encoded.
The manifest also records each split's ``source``: a folder holding a conversion of other data is
refused unless ``overwrite`` (:mod:`gsdistill.detect.convert_output`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable

# COCO sources live in their own module; both write through the shared folder writer (yolo_folder)
from gsdistill.detect.coco_convert import coco_to_yolo, convert_release  # noqa: F401 (re-exported)
from gsdistill.detect.convert_output import conversion_output
from gsdistill.detect.yolo_folder import (IMAGE_SUFFIXES, SPLITS, DatasetError, _class_index, _link,  # noqa: F401
                                          _Writer, assign_splits, clip_box, yolo_line)  # (re-exported: their old home)
from gsdistill.output_removal import discard
from gsdistill.tuples.labels import DOCLAYNET_CLASSES


def pages_to_yolo(pages: Iterable[dict], out_dir: str | Path, val_fraction: float = 0.2, seed: int = 0,
                  names: list[str] | None = None, category_map: dict | None = None,
                  val_docs: Iterable[str] | None = None, source: str | None = None, overwrite: bool = False,
                  inputs: list[tuple[str, str | Path]] = ()) -> Path:
    """Write page tuples (``boxes`` in pixels) as a detection set split by ``doc_id``; return the data YAML.

    Page images are saved as PNG; each split also gets a COCO json (``coco/<split>.json``) so
    pycocotools scores the same boxes. A box category outside ``names`` (default: DocLayNet's 11)
    and ``category_map`` is an error, as is a bbox that is not four finite numbers; pages without a
    usable box are skipped and recorded. ``source`` names the pages in the manifest: ``out_dir``
    holding a conversion of another source is refused unless ``overwrite``
    (:mod:`gsdistill.detect.convert_output`); ``inputs`` (``(label, path)``) are what the pages are
    read from, which ``out_dir`` must neither be, lie in nor hold.
    """
    names = list(names or DOCLAYNET_CLASSES)
    index = _class_index(names, category_map)
    with conversion_output(out_dir, inputs) as out:
        writer = _Writer(out, names, {"train": source, "val": source}, whole=True, overwrite=overwrite)
        return _write_pages(pages, writer, index, val_fraction, seed, val_docs)


def _write_pages(pages, writer: _Writer, index: dict, val_fraction: float, seed: int, val_docs) -> Path:
    names = writer.names
    staging = writer.out / "_staging"
    staging.mkdir(parents=True, exist_ok=True)
    records, skipped = [], []
    for page in pages:  # pass 1: labels in memory, images to a staging folder (pages may be a stream)
        w, h = int(page["width"]), int(page["height"])
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(page["id"]))
        lines, anns = [], []
        for box in page.get("boxes", []):
            cat = str(box["category"]).lower()
            if cat not in index:
                raise DatasetError(f"page '{page['id']}' ({page.get('source')}): box category "
                                   f"'{box['category']}' is not one of the classes {names}")
            cls = index[cat]
            bbox = box["bbox"]
            if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(
                    isinstance(v, (int, float)) and math.isfinite(v) for v in bbox):
                raise DatasetError(f"page '{page['id']}' ({page.get('source')}): box {box['category']} bbox {bbox!r} "
                                   "is not four finite numbers [x0, y0, x1, y1]; fix the page's boxes")
            line = yolo_line(cls, bbox, w, h) if cls is not None else None
            if line is None:
                skipped.append((f"{page['id']} {box['category']} {box['bbox']}",
                                "category mapped to drop" if cls is None else "box without area after clipping"))
                continue
            lines.append(line)
            x0, y0, x1, y1 = clip_box(box["bbox"], w, h)  # the box the label line holds
            anns.append({"category_id": cls + 1, "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0),
                         "iscrowd": 0})
        if not lines:
            skipped.append((str(page["id"]), "no usable box (an empty label file would be background)"))
            continue
        tmp = staging / f"{stem}.png"
        if tmp.exists():
            raise DatasetError(f"two pages share the id/file stem '{stem}'")
        page["image"].convert("RGB").save(tmp)
        records.append((str(page.get("doc_id") or page["id"]), stem, lines, anns, w, h))
    if val_docs is not None:  # an explicit held-out set of documents (e.g. never pretrained on)
        held = {str(d) for d in val_docs}
        split_of = {r[0]: ("val" if r[0] in held else "train") for r in records}
    else:
        split_of = assign_splits((r[0] for r in records), val_fraction, seed)
    # an evaluation-only set (every document named in val_docs) has no train split; otherwise both
    # splits must hold pages (Writer.finish says which one is empty)
    splits = ("val",) if val_docs is not None and set(split_of.values()) == {"val"} else ("train", "val")
    for s in splits:
        writer.start_split(s)
    for item, reason in skipped:
        writer.skip(splits[0], item, reason)
    coco = {s: {"images": [], "annotations": [],
                "categories": [{"id": i + 1, "name": n} for i, n in enumerate(names)]} for s in splits}
    image_ids, doc_ids = {"train": {}, "val": {}}, {"train": {}, "val": {}}  # both splits rewritten: no stale stems
    for doc, stem, lines, anns, w, h in records:  # pass 2: place each page in its document's split
        s = split_of[doc]
        image_path = writer.add(s, stem, lines, staging / f"{stem}.png", move=True)
        image_id = len(coco[s]["images"]) + 1
        coco[s]["images"].append({"id": image_id, "file_name": image_path.name, "width": w, "height": h})
        for ann in anns:
            coco[s]["annotations"].append({"id": len(coco[s]["annotations"]) + 1, "image_id": image_id, **ann})
        image_ids[s][stem], doc_ids[s][stem] = image_id, doc  # doc: what a bootstrap over documents resamples
    discard(staging)  # what the conversion put there, never through a link
    (writer.out / "coco").mkdir(exist_ok=True)
    for s in splits:
        path = writer.out / "coco" / f"{s}.json"
        path.write_text(json.dumps(coco[s]))
        writer.sidecar[s] = {"coco_json": str(path.resolve()),
                             "image_ids": image_ids[s], "doc_ids": doc_ids[s],
                             "category_ids": list(range(1, len(names) + 1))}
    return writer.finish()

