"""The Ultralytics detection folder every converter writes: ``images/<split>/``, ``labels/<split>/``,
``manifest.json``, ``coco_eval.json`` and the data YAML (:class:`_Writer`), with the box arithmetic
both label lines and the COCO json pycocotools scores against use (:func:`clip_box`).

Shared by :mod:`gsdistill.detect.convert` (page tuples) and :mod:`gsdistill.detect.coco_convert` (COCO
jsons), which both sit above it: neither imports the other's module for it.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Iterable

import yaml

from gsdistill.detect.convert_output import claim
from gsdistill.errors import GsdistillError
from gsdistill.output_removal import discard

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
        if discard(dst).kept or dst.exists() or dst.is_symlink():  # a link goes, never what it points to
            raise DatasetError(f"{dst}: a file gsdistill did not write is where this link goes; move it")
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
            if folder.exists() or folder.is_symlink():
                kept = discard(folder).kept  # what gsdistill wrote there; never through a link
                if kept:
                    raise DatasetError(f"{folder}: holds files gsdistill did not write ({', '.join(kept[:3])}); "
                                       "move them, or convert into another --out")
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
