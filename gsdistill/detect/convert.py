"""Layout data -> the Ultralytics detection layout (images/<split>/, labels/<split>/, data YAML).

Sources: page tuples (synthetic pages, DocBank region boxes, anything ``gsdistill.tuples`` builds;
here) and COCO layout jsons (DocLayNet and PubLayNet releases, any COCO detection file;
:mod:`gsdistill.detect.coco_convert`, re-exported here).

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
import os
import random
import shutil
from pathlib import Path
from typing import Iterable

import yaml

from gsdistill.detect.convert_output import claim, conversion_output
from gsdistill.errors import GsdistillError
from gsdistill.tuples.labels import DOCLAYNET_CLASSES
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
SPLITS = ("train", "val", "test")


class DatasetError(GsdistillError, ValueError):
    """Input data that cannot be converted or trained on; the message names the file and problem."""


def clip_box(bbox_xyxy: list[float], width: int, height: int) -> tuple[float, float, float, float] | None:
    """``bbox_xyxy`` (corners in any order) clipped to the image; None when less than 1 px remains either way.

    Labels and the COCO json pycocotools scores against both use this box, so the score is against
    exactly what was trained on.
    """
    x0, y0, x1, y1 = (float(v) for v in bbox_xyxy)
    x0, x1 = max(0.0, min(x0, x1)), min(float(width), max(x0, x1))
    y0, y1 = max(0.0, min(y0, y1)), min(float(height), max(y0, y1))
    if x1 - x0 < 1.0 or y1 - y0 < 1.0:
        return None
    return x0, y0, x1, y1


def yolo_line(cls: int, bbox_xyxy: list[float], width: int, height: int) -> str | None:
    """One label line ``cls cx cy w h`` (normalised); None when the clipped box has no area."""
    box = clip_box(bbox_xyxy, width, height)
    if box is None:
        return None
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) / 2 / width, (y0 + y1) / 2 / height
    return f"{cls} {cx:.6f} {cy:.6f} {(x1 - x0) / width:.6f} {(y1 - y0) / height:.6f}"


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    try:
        os.symlink(src.resolve(), dst)
    except OSError:  # file systems without symlinks
        shutil.copy2(src, dst)


def _class_index(names: list[str], category_map: dict | None) -> dict[str, int | None]:
    """Source category name (lower case) -> class index, or None for a category mapped to drop."""
    index = {n.lower(): i for i, n in enumerate(names)}
    for src, dst in (category_map or {}).items():
        if dst is None:
            index[str(src).lower()] = None
        elif str(dst).lower() not in index:
            raise DatasetError(f"category_map: '{src}' -> '{dst}', but '{dst}' is not one of the names {names}")
        else:
            index[str(src).lower()] = index[str(dst).lower()]
    return index


class _Writer:
    """Accumulates one output folder: labels, image links, manifest and COCO-eval sidecar.

    ``sources``: split -> what it is converted from (recorded in the manifest); ``whole``: this
    conversion owns the folder. The folder is claimed (:func:`~gsdistill.detect.convert_output.claim`:
    refused, or the conversion it replaces removed) before anything is written, and the manifest is
    written at once, so even a conversion that stops half-way is recognised as one of its source."""

    def __init__(self, out_dir: str | Path, names: list[str], sources: dict[str, str | None], whole: bool,
                 overwrite: bool = False):
        self.out = Path(out_dir)
        self.names = list(names)
        self.sources = dict(sources)
        claim(self.out, self.names, self.sources, whole, overwrite)
        self.manifest = self._read("manifest.json", {"names": self.names, "splits": {}})
        self.sidecar = self._read("coco_eval.json", {})
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "manifest.json").write_text(json.dumps(self.manifest, indent=1))

    def _read(self, name: str, default: dict) -> dict:
        path = self.out / name
        return json.loads(path.read_text()) if path.is_file() else default

    def start_split(self, split: str) -> None:
        if split not in SPLITS:
            raise DatasetError(f"split '{split}' must be one of {SPLITS}")
        for sub in ("images", "labels"):
            folder = self.out / sub / split
            if folder.is_dir():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
        self.manifest["splits"][split] = {"source": self.sources.get(split), "images": 0, "boxes": 0, "skipped": [],
                                          "clipped": []}
        (self.out / "manifest.json").write_text(json.dumps(self.manifest, indent=1))

    def add(self, split: str, stem: str, lines: list[str], image_src: Path | None = None,
            move: bool = False) -> Path:
        label = self.out / "labels" / split / f"{stem}.txt"
        if label.exists():
            raise DatasetError(f"two images of split '{split}' share the file stem '{stem}'")
        label.write_text("\n".join(lines) + "\n")
        stats = self.manifest["splits"][split]
        stats["images"] += 1
        stats["boxes"] += len(lines)
        img = self.out / "images" / split / (stem + (image_src.suffix.lower() if image_src else ".png"))
        if image_src is not None and move:
            image_src.replace(img)
        elif image_src is not None:
            _link(image_src, img)
        return img

    def skip(self, split: str, what: str, reason: str) -> None:
        self.manifest["splits"][split]["skipped"].append({"item": what, "reason": reason})

    def clipped(self, split: str, what: str, before: list[float], after: tuple) -> None:
        """A box that reached past the image: trained (and scored) as ``after``."""
        self.manifest["splits"][split]["clipped"].append(
            {"item": what, "bbox_xyxy": [round(float(v), 2) for v in before],
             "clipped_xyxy": [round(float(v), 2) for v in after]})

    def finish(self) -> Path:
        for split, stats in self.manifest["splits"].items():
            if stats["images"] == 0:
                raise DatasetError(f"{self.out}: split '{split}' has no image with a usable box "
                                   f"({len(stats['skipped'])} skipped, e.g. {stats['skipped'][:3]})")
        (self.out / "manifest.json").write_text(json.dumps(self.manifest, indent=1))
        (self.out / "coco_eval.json").write_text(json.dumps(self.sidecar, indent=1))
        splits = self.manifest["splits"]
        data = {"path": str(self.out.resolve()),
                "train": "images/train" if "train" in splits else "images/val",
                "val": "images/val" if "val" in splits else "images/train",
                **({"test": "images/test"} if "test" in splits else {}),
                "nc": len(self.names), "names": dict(enumerate(self.names))}
        path = self.out / "data.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


def assign_splits(keys: Iterable[str], val_fraction: float, seed: int) -> dict[str, str]:
    """key -> "train" | "val": a seeded shuffle of the distinct keys, the first round(n * fraction)
    (at least 1 and at most n - 1 when there are 2+ keys and fraction > 0) go to val."""
    distinct = sorted(set(keys))
    random.Random(seed).shuffle(distinct)
    n_val = round(len(distinct) * val_fraction)
    if val_fraction > 0 and len(distinct) > 1:
        n_val = min(max(n_val, 1), len(distinct) - 1)
    return {k: ("val" if i < n_val else "train") for i, k in enumerate(distinct)}


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
    shutil.rmtree(staging)
    (writer.out / "coco").mkdir(exist_ok=True)
    for s in splits:
        path = writer.out / "coco" / f"{s}.json"
        path.write_text(json.dumps(coco[s]))
        writer.sidecar[s] = {"coco_json": str(path.resolve()),
                             "image_ids": image_ids[s], "doc_ids": doc_ids[s],
                             "category_ids": list(range(1, len(names) + 1))}
    return writer.finish()


# COCO sources live in their own module (this one holds the shared writer); re-exported here
from gsdistill.detect.coco_convert import coco_to_yolo, convert_release  # noqa: E402,F401
