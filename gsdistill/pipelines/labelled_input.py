"""The labelled pages of ``gsdistill demo --coco FILE --images DIR`` (or ``--release DIR --dataset ...``):
read and checked, each image's document, and the classes the detectors learn.

Only the image files of these pages ever reach pretraining (``gsdistill.pipelines.labelled_pages``);
the boxes and category names read here go to the detection data alone.

- Documents (``doc_key``): a field of each image entry the user names, else ``source_book`` when every
  image has one, else DocLayNet's ``doc_name``, else the file name's prefix before its last ``_``
  (``PMC123_00004.jpg`` -> ``PMC123``, PubLayNet's and most scan folders' naming).
- Classes (``class_map``): the set's own names; ``coarse``, the part of each name before a ``:``
  (SegmOnto's ``MainZone:commentary`` -> ``MainZone``); or a YAML/JSON file ``{source name: target
  name, or null to drop}`` (names it leaves out keep their own). A class with fewer than
  ``min_class_boxes`` boxes after the map is left out of the detection data and named in the report.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import yaml

from gsdistill.errors import CorruptFileError, InputError, MissingFileError

DOC_KEYS = ("source_book", "doc_name")  # what a COCO file of scans / a DocLayNet release names documents by
PRESETS = ("coarse",)


def copy_name(name: str) -> str:
    """Where an image's copies live under a copy folder (``labelled_pages``): its own relative name, as PNG."""
    return Path(name).with_suffix(".png").as_posix()


def release_inputs(root: str | Path, dataset: str) -> list[tuple[Path, Path]]:
    """(COCO json, its image folder) of every split file of an official release folder."""
    root = Path(root)
    if dataset == "doclaynet":
        pairs = [(root / "COCO" / f"{s}.json", root / "PNG") for s in ("train", "val", "test")]
    elif dataset == "publaynet":
        pairs = [(root / f"{s}.json", root / s) for s in ("train", "val")]
    else:
        raise InputError(f"--dataset {dataset!r}: choose doclaynet or publaynet")
    found = [(j, d) for j, d in pairs if j.is_file()]
    if not found:
        raise MissingFileError(f"--release {root}: no {dataset} split file (looked for "
                               f"{', '.join(str(j) for j, _ in pairs)})")
    return found


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise MissingFileError(f"{path}: no such COCO file")
    try:
        coco = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptFileError(f"{path}: cannot read COCO json ({type(e).__name__}: {e})") from None
    for key in ("images", "annotations", "categories"):
        if not isinstance(coco, dict) or not isinstance(coco.get(key), list):
            raise CorruptFileError(f"{path}: not a COCO detection file (no '{key}' list)")
    return coco


def read_labelled(pairs: list[tuple[Path, Path]]) -> dict:
    """Every image (``file``: its path, ``name``: its ``file_name``, ``entry``: its json entry) with its
    boxes ``[(category name, [x, y, w, h])]``; several split files are joined. A missing image file or an
    annotation of an unknown image is a recorded skip; a malformed entry is one line naming the file."""
    images, skips, names = [], [], []
    for path, folder in pairs:
        coco = _read_json(Path(path))
        cats = {}
        for c in coco["categories"]:
            if not isinstance(c, dict) or "id" not in c or not isinstance(c.get("name"), str):
                raise CorruptFileError(f"{path}: category entry {c!r} has no id and name")
            cats[c["id"]] = c["name"]
            names += [c["name"]] if c["name"] not in names else []
        by_id = {}
        for k, img in enumerate(coco["images"]):
            if not isinstance(img, dict) or not {"id", "file_name", "width", "height"} <= img.keys():
                raise CorruptFileError(f"{path}: images[{k}] lacks id, file_name, width or height")
            file = Path(folder) / str(img["file_name"])
            if not file.is_file():
                skips.append({"source": str(file), "reason": f"image of {path} not found"})
                continue
            by_id[img["id"]] = {"file": file, "name": str(img["file_name"]), "entry": img, "boxes": []}
        for k, ann in enumerate(coco["annotations"]):
            bbox = ann.get("bbox") if isinstance(ann, dict) else None
            if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
                raise CorruptFileError(f"{path}: annotations[{k}] has no bbox [x, y, w, h]")
            if ann.get("category_id") not in cats:
                raise CorruptFileError(f"{path}: annotations[{k}] has category id {ann.get('category_id')!r} "
                                       "missing from 'categories'")
            if ann.get("image_id") in by_id:
                by_id[ann["image_id"]]["boxes"].append((cats[ann["category_id"]], [float(v) for v in bbox]))
        images += list(by_id.values())
    if not images:
        raise MissingFileError(f"{pairs[0][0]}: none of its images found under {pairs[0][1]}")
    return {"images": images, "categories": names, "skipped": skips}


def documents(images: list[dict], doc_key: str | None) -> tuple[str, dict[str, str]]:
    """(how documents were found, in words; image name -> document)."""
    if doc_key:
        missing = [im["name"] for im in images if im["entry"].get(doc_key) in (None, "")]
        if missing:
            raise InputError(f"--doc-key {doc_key}: {len(missing)} image(s) have no '{doc_key}' field "
                             f"(first: {missing[0]})")
        return f"the images' `{doc_key}` field (--doc-key)", {im["name"]: str(im["entry"][doc_key]) for im in images}
    for key in DOC_KEYS:
        if all(im["entry"].get(key) not in (None, "") for im in images):
            return f"the images' `{key}` field", {im["name"]: str(im["entry"][key]) for im in images}
    return ("the file name's prefix before its last `_` (no `source_book` or `doc_name` field; name one with "
            "--doc-key)", {im["name"]: Path(im["name"]).stem.rsplit("_", 1)[0] for im in images})


def class_map(spec: str | None, names: list[str]) -> dict[str, str | None]:
    """Source category name -> target class name (None: dropped) for every name of the set."""
    if not spec:
        return {n: n for n in names}
    if spec == "coarse":
        return {n: n.split(":", 1)[0].strip() for n in names}
    path = Path(spec)
    if not path.is_file():
        raise MissingFileError(f"--class-map {spec}: neither a preset ({', '.join(PRESETS)}) nor a file")
    try:
        mapping = yaml.safe_load(path.read_text())  # JSON is YAML
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise CorruptFileError(f"--class-map {path}: cannot read ({type(e).__name__})") from None
    if not isinstance(mapping, dict) or not all(isinstance(v, (str, type(None))) for v in mapping.values()):
        raise CorruptFileError(f"--class-map {path}: not a mapping of class name -> class name or null")
    unknown = sorted(set(map(str, mapping)) - set(names))
    if unknown:
        raise InputError(f"--class-map {path}: {', '.join(unknown[:3])} not a category of the labelled pages "
                         f"(they are: {', '.join(names)})")
    return {n: mapping.get(n, n) for n in names}


def target_classes(images: list[dict], mapping: dict[str, str | None], min_boxes: int) -> tuple[list[str], dict]:
    """(the classes the detectors learn, in first-seen order; ``{"dropped": {class: boxes}, "merged":
    {target: [sources]}, "boxes": {class: boxes}}``): classes with fewer than ``min_boxes`` boxes dropped."""
    counts = Counter(mapping[c] for im in images for c, _ in im["boxes"] if mapping[c] is not None)
    order = list(dict.fromkeys(t for t in mapping.values() if t is not None))
    kept = [t for t in order if counts[t] >= min_boxes]
    if not kept:
        raise InputError(f"no class has {min_boxes} or more boxes (min_class_boxes); counts: {dict(counts)}")
    merged = {t: [s for s, v in mapping.items() if v == t] for t in order}
    return kept, {"dropped": {t: counts[t] for t in order if t not in kept},
                  "merged": {t: s for t, s in merged.items() if len(s) > 1 or s != [t]},
                  "unmapped": sorted(s for s, t in mapping.items() if t is None),
                  "boxes": {t: counts[t] for t in kept}}
