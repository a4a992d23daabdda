"""Checks of a COCO json's entries against what they describe, before a label is written.

A malformed entry is refused in one line naming the json and the entry (``DatasetError``): a bbox
that is not four finite numbers, an image without a positive size, an image id or category id given
twice with different contents, a json size that differs from the image file's. Entries that are
well-formed but unusable (zero or negative width/height, nothing left inside the image) are recorded
skips, counted by the converter; none is turned into a different label.
"""
from __future__ import annotations

import math
from pathlib import Path

from gsdistill.detect.yolo_folder import DatasetError


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def category_classes(path: Path, categories: list, index: dict[str, int | None], names: list[str]) -> dict:
    """json category id -> class index (None: mapped to drop). An id defined twice with different names
    is refused (which name is meant cannot be told); the same definition repeated is fine."""
    named: dict = {}
    for k, cat in enumerate(categories):
        if not isinstance(cat, dict) or "id" not in cat or not isinstance(cat.get("name"), str):
            raise DatasetError(f"{path}: categories[{k}] {cat!r} has no id and name; fix the json")
        if cat["id"] in named and named[cat["id"]] != cat["name"]:
            raise DatasetError(f"{path}: category id {cat['id']} is defined twice, as '{named[cat['id']]}' and "
                               f"'{cat['name']}'; its annotations could be either: give each category its own id")
        named[cat["id"]] = cat["name"]
    classes = {}
    for cid, name in named.items():
        if name.lower() not in index:
            raise DatasetError(f"{path}: category '{name}' (id {cid}) is not one of the classes {names}; "
                               "map it with category_map (None drops it)")
        classes[cid] = index[name.lower()]
    return classes


def image_table(path: Path, images: list) -> dict:
    """json image id -> image entry, each with a file name and a positive, finite width and height."""
    table: dict = {}
    for k, img in enumerate(images):
        if not isinstance(img, dict) or "id" not in img or not isinstance(img.get("file_name"), str):
            raise DatasetError(f"{path}: images[{k}] has no id and file_name; fix the json")
        if not all(_number(img.get(key)) and img[key] > 0 for key in ("width", "height")):
            raise DatasetError(f"{path}: image {img['id']} ('{img['file_name']}') has width {img.get('width')!r} and "
                               f"height {img.get('height')!r}, not two positive numbers; its boxes cannot be placed")
        if img["id"] in table and table[img["id"]] != img:
            raise DatasetError(f"{path}: image id {img['id']} is given twice ('{table[img['id']]['file_name']}' and "
                               f"'{img['file_name']}'); its annotations could belong to either: make the ids unique")
        table[img["id"]] = img
    return table


def annotation_what(ann: dict, k: int) -> str:
    return f"annotation {ann['id']}" if isinstance(ann, dict) and "id" in ann else f"annotations[{k}] (no id)"


def annotation_box(path: Path, ann, k: int) -> tuple[float, float, float, float]:
    """``(x, y, w, h)`` of a COCO annotation: four finite numbers, else DatasetError naming it."""
    if not isinstance(ann, dict) or "image_id" not in ann or "category_id" not in ann:
        raise DatasetError(f"{path}: {annotation_what(ann, k)} has no image_id and category_id; fix the json")
    box = ann.get("bbox")
    if not isinstance(box, (list, tuple)) or len(box) != 4 or not all(_number(v) for v in box):
        raise DatasetError(f"{path}: {annotation_what(ann, k)} (image {ann['image_id']}): bbox {box!r} is not four "
                           "finite numbers [x, y, width, height]; fix or remove the annotation")
    return tuple(float(v) for v in box)


def size_mismatch(path: Path, img: dict, image_file: Path) -> None:
    """DatasetError when the image file's size (as Ultralytics reads it: EXIF rotation applied) is not
    the json's width x height: every box of it would be scaled to the wrong place. An image that does
    not open is left to the data check (a recorded skip at training)."""
    from PIL import Image
    from ultralytics.data.utils import exif_size

    try:
        with Image.open(image_file) as im:
            w, h = exif_size(im)
    except Exception:  # unreadable: the data check names it
        return
    if (w, h) != (img["width"], img["height"]):
        raise DatasetError(f"{path}: image {img['id']} ('{img['file_name']}') is {img['width']}x{img['height']} in "
                           f"the json but {w}x{h} in {image_file}; its boxes would land in the wrong place: fix "
                           "the json's width and height")
