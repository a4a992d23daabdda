"""Layout data -> the Ultralytics detection layout (images/<split>/, labels/<split>/, data YAML).

Sources: a COCO layout json (DocLayNet and PubLayNet releases, or any COCO detection file) and
page tuples (synthetic pages, DocBank region boxes, anything ``gsdistill.data`` builds).

Every output folder also holds
- ``manifest.json``: counts per split and every skipped image/box with its reason (nothing is
  dropped silently);
- ``coco_eval.json``: per split, the COCO json to score against with pycocotools, the map from
  image file stem to that json's image id and the json category id of each class index; so
  :func:`gsdistill.detect.evaluate.coco_eval` scores Ultralytics' own predictions on the original
  annotations.
Images are symlinked from the source (copied where links are impossible), never re-encoded.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Iterable

import yaml

from gsdistill.data.labels import DOCLAYNET_CLASSES, PUBLAYNET_CLASSES
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
SPLITS = ("train", "val", "test")


class DatasetError(ValueError):
    """Input data that cannot be converted or trained on; the message names the file and problem."""


def yolo_line(cls: int, bbox_xyxy: list[float], width: int, height: int) -> str | None:
    """One label line ``cls cx cy w h`` (normalised); None when the clipped box has no area."""
    x0, y0, x1, y1 = (float(v) for v in bbox_xyxy)
    x0, x1 = max(0.0, min(x0, x1)), min(float(width), max(x0, x1))
    y0, y1 = max(0.0, min(y0, y1)), min(float(height), max(y0, y1))
    if x1 - x0 < 1.0 or y1 - y0 < 1.0:
        return None
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
    """Accumulates one output folder: labels, image links, manifest and COCO-eval sidecar."""

    def __init__(self, out_dir: str | Path, names: list[str]):
        self.out = Path(out_dir)
        self.names = list(names)
        self.manifest = self._read("manifest.json", {"names": self.names, "splits": {}})
        self.sidecar = self._read("coco_eval.json", {})
        if self.manifest["names"] != self.names:
            raise DatasetError(f"{self.out}: already holds classes {self.manifest['names']}, not {self.names}")

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
        self.manifest["splits"][split] = {"images": 0, "boxes": 0, "skipped": []}

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


def coco_to_yolo(coco_json: str | Path, images_dir: str | Path, out_dir: str | Path, names: list[str],
                 split: str | None = None, val_fraction: float = 0.2, seed: int = 0,
                 category_map: dict | None = None, missing_images: str = "error") -> Path:
    """Convert one COCO detection json; return the data YAML path.

    ``split`` puts every image in that split (call once per official split file); None splits the
    images at random (seeded) with ``val_fraction`` into val. Categories are matched to ``names`` by
    name (case-insensitive) after ``category_map`` (source name -> target name, or None to drop; the
    drops are counted). A category outside ``names`` and the map is an error, as is a missing image
    unless ``missing_images="skip"`` (then recorded in the manifest).
    """
    coco_json, images_dir = Path(coco_json), Path(images_dir)
    try:
        coco = json.loads(coco_json.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"{coco_json}: cannot read COCO json ({e})") from None
    for key in ("images", "annotations", "categories"):
        if key not in coco:
            raise DatasetError(f"{coco_json}: not a COCO detection file (no '{key}')")
    index = _class_index(names, category_map)
    cat_class = {}
    for cat in coco["categories"]:
        if cat["name"].lower() not in index:
            raise DatasetError(f"{coco_json}: category '{cat['name']}' (id {cat['id']}) is not one of the "
                               f"classes {names}; map it with category_map (None drops it)")
        cat_class[cat["id"]] = index[cat["name"].lower()]
    per_image: dict[int, list] = {}
    for ann in coco["annotations"]:
        if ann["category_id"] not in cat_class:
            raise DatasetError(f"{coco_json}: annotation {ann.get('id')} has category id {ann['category_id']} "
                               "missing from 'categories'")
        per_image.setdefault(ann["image_id"], []).append(ann)
    writer = _Writer(out_dir, names)
    splits = [split] if split else ["train", "val"]
    for s in splits:
        writer.start_split(s)
    # json category id of each class (first source category mapped to it) for pycocotools
    class_cat = {c: cid for cid, c in reversed(list(cat_class.items())) if c is not None}
    ids: dict[str, dict] = {s: {} for s in splits}
    split_of = assign_splits((i["file_name"] for i in coco["images"]), val_fraction, seed) if not split else {}
    for img in coco["images"]:
        s = split or split_of[img["file_name"]]
        src = images_dir / img["file_name"]
        if not src.is_file():
            if missing_images == "skip":
                writer.skip(s, str(src), "image file missing")
                continue
            raise DatasetError(f"{coco_json}: image '{img['file_name']}' (id {img['id']}) not found at {src}")
        lines, dropped = [], 0
        for ann in per_image.get(img["id"], []):
            cls = cat_class[ann["category_id"]]
            x, y, w, h = ann["bbox"]
            line = yolo_line(cls, [x, y, x + w, y + h], img["width"], img["height"]) if cls is not None else None
            if line is None:
                dropped += 1
                writer.skip(s, f"{img['file_name']} ann {ann.get('id')}",
                            "category mapped to drop" if cls is None else "box without area after clipping")
            else:
                lines.append(line)
        if not lines:
            writer.skip(s, img["file_name"], "no usable box (an empty label file would be background)")
            continue
        writer.add(s, src.stem, lines, src)
        ids[s][src.stem] = img["id"]
    merged = sum(c is not None for c in cat_class.values()) > len(class_cat)
    for s in splits:
        if merged:  # several source categories -> one class: score against a json with merged ids
            writer.sidecar[s] = _merged_coco(coco, cat_class, ids[s], names, writer.out / "coco" / f"{s}.json")
        else:
            writer.sidecar[s] = {"coco_json": str(coco_json.resolve()), "image_ids": ids[s],
                                 "category_ids": [class_cat.get(c) for c in range(len(names))]}
    return writer.finish()


def _merged_coco(coco: dict, cat_class: dict, image_ids: dict, names: list[str], path: Path) -> dict:
    """Write the split's images of ``coco`` with category ids replaced by class index + 1; its sidecar."""
    keep = set(image_ids.values())
    out = {"images": [i for i in coco["images"] if i["id"] in keep],
           "annotations": [{**a, "category_id": cat_class[a["category_id"]] + 1} for a in coco["annotations"]
                           if a["image_id"] in keep and cat_class[a["category_id"]] is not None],
           "categories": [{"id": i + 1, "name": n} for i, n in enumerate(names)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return {"coco_json": str(path.resolve()), "image_ids": image_ids,
            "category_ids": list(range(1, len(names) + 1))}


def convert_release(root: str | Path, dataset: str, out_dir: str | Path, names: list[str] | None = None,
                    category_map: dict | None = None, missing_images: str = "error") -> Path:
    """Convert an official DocLayNet or PubLayNet release folder; return the data YAML path.

    DocLayNet core: ``root/COCO/{train,val,test}.json`` with images in ``root/PNG/``.
    PubLayNet: ``root/{train,val}.json`` with images in ``root/{train,val}/``.
    """
    root = Path(root)
    if dataset == "doclaynet":
        pairs = [(s, root / "COCO" / f"{s}.json", root / "PNG") for s in SPLITS]
        names = names or list(DOCLAYNET_CLASSES)
    elif dataset == "publaynet":
        pairs = [(s, root / f"{s}.json", root / s) for s in ("train", "val")]
        names = names or PUBLAYNET_CLASSES
    else:
        raise DatasetError(f"dataset '{dataset}' must be 'doclaynet' or 'publaynet'")
    found = [(s, j, d) for s, j, d in pairs if j.is_file()]
    if not found:
        raise DatasetError(f"{root}: no {dataset} split files found (looked for {[str(j) for _, j, _ in pairs]})")
    for s, j, d in found:
        path = coco_to_yolo(j, d, out_dir, names, split=s, category_map=category_map, missing_images=missing_images)
    return path


def pages_to_yolo(pages: Iterable[dict], out_dir: str | Path, val_fraction: float = 0.2, seed: int = 0,
                  names: list[str] | None = None, category_map: dict | None = None) -> Path:
    """Write page tuples (``boxes`` in pixels) as a detection set split by ``doc_id``; return the data YAML.

    Page images are saved as PNG; each split also gets a COCO json (``coco/<split>.json``) so
    pycocotools scores the same boxes. A box category outside ``names`` (default: DocLayNet's 11)
    and ``category_map`` is an error; pages without a usable box are skipped and recorded.
    """
    names = list(names or DOCLAYNET_CLASSES)
    index = _class_index(names, category_map)
    writer = _Writer(out_dir, names)
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
            line = yolo_line(cls, box["bbox"], w, h) if cls is not None else None
            if line is None:
                skipped.append((f"{page['id']} {box['category']} {box['bbox']}",
                                "category mapped to drop" if cls is None else "box without area after clipping"))
                continue
            lines.append(line)
            x0, y0 = max(float(box["bbox"][0]), 0.0), max(float(box["bbox"][1]), 0.0)
            bw, bh = min(float(box["bbox"][2]), w) - x0, min(float(box["bbox"][3]), h) - y0
            anns.append({"category_id": cls + 1, "bbox": [x0, y0, bw, bh], "area": bw * bh, "iscrowd": 0})
        if not lines:
            skipped.append((str(page["id"]), "no usable box (an empty label file would be background)"))
            continue
        tmp = staging / f"{stem}.png"
        if tmp.exists():
            raise DatasetError(f"two pages share the id/file stem '{stem}'")
        page["image"].convert("RGB").save(tmp)
        records.append((str(page.get("doc_id") or page["id"]), stem, lines, anns, w, h))
    split_of = assign_splits((r[0] for r in records), val_fraction, seed)
    for s in ("train", "val"):
        writer.start_split(s)
    for item, reason in skipped:
        writer.skip("train", item, reason)
    coco = {s: {"images": [], "annotations": [],
                "categories": [{"id": i + 1, "name": n} for i, n in enumerate(names)]} for s in ("train", "val")}
    for doc, stem, lines, anns, w, h in records:  # pass 2: place each page in its document's split
        s = split_of[doc]
        image_path = writer.add(s, stem, lines, staging / f"{stem}.png", move=True)
        image_id = len(coco[s]["images"]) + 1
        coco[s]["images"].append({"id": image_id, "file_name": image_path.name, "width": w, "height": h})
        for ann in anns:
            coco[s]["annotations"].append({"id": len(coco[s]["annotations"]) + 1, "image_id": image_id, **ann})
        writer.sidecar.setdefault(s, {"image_ids": {}})["image_ids"][stem] = image_id
    shutil.rmtree(staging)
    (writer.out / "coco").mkdir(exist_ok=True)
    for s in ("train", "val"):
        path = writer.out / "coco" / f"{s}.json"
        path.write_text(json.dumps(coco[s]))
        writer.sidecar[s] = {"coco_json": str(path.resolve()),
                             "image_ids": writer.sidecar.get(s, {}).get("image_ids", {}),
                             "category_ids": list(range(1, len(names) + 1))}
    return writer.finish()
