"""A low-label detection set: a seeded share of a data YAML's training pages, its held-out pages whole.

Paper 003's claim is strongest where labels are few; :func:`subset_data` makes that setting from any
data YAML of ``gsdistill detect convert`` without copying an image (symlinks), and
:func:`epochs_for_steps` gives the epochs at which the smaller set gets the optimizer steps of the
full one, so a comparison changes the labels and not the budget.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import yaml

from gsdistill.detect.yolo_folder import IMAGE_SUFFIXES, DatasetError, _link
from gsdistill.output_removal import discard


def subset_data(data_yaml: str | Path, fraction: float, seed: int, out: str | Path) -> Path:
    """A data YAML whose train split is a seeded ``fraction`` (0 < f <= 1) of ``data_yaml``'s training
    images (at least one), each linked with its label file; the val split, ``coco_eval.json`` and
    ``manifest.json`` are ``data_yaml``'s own. ``subset.json`` records what was kept."""
    if not 0.0 < float(fraction) <= 1.0:
        raise DatasetError(f"subset of {data_yaml}: fraction must be in (0, 1], got {fraction}")
    data_yaml, out = Path(data_yaml), Path(out)
    data = yaml.safe_load(data_yaml.read_text())
    root = Path(data["path"])
    train_dir = root / data["train"]
    if not train_dir.is_dir():
        raise DatasetError(f"{data_yaml}: train entry {data['train']!r} is not a folder of images under {root}")
    images = sorted(p for p in train_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise DatasetError(f"{data_yaml}: no training images in {train_dir}")
    keep = sorted(random.Random(seed).sample(images, max(1, round(float(fraction) * len(images)))))
    for sub in ("images/train", "labels/train"):
        folder = out / sub
        if folder.exists() or folder.is_symlink():  # a subset made before, maybe of another fraction: start over
            kept = discard(folder).kept  # what gsdistill wrote there (links to the images), never through a link
            if kept:
                raise DatasetError(f"{folder}: holds files gsdistill did not write ({', '.join(kept[:3])}); move them")
        folder.mkdir(parents=True, exist_ok=True)
    labels = root / "labels" / Path(data["train"]).name
    for img in keep:
        label = labels / (img.stem + ".txt")
        if not label.is_file():
            raise DatasetError(f"{data_yaml}: training image {img.name} has no label file {label}")
        _link(img, out / "images" / "train" / img.name)  # the converter's link (a copy where links are impossible)
        _link(label, out / "labels" / "train" / label.name)
    for sub in ("images/val", "labels/val"):
        link = out / sub
        if not link.exists():
            link.symlink_to((root / sub).resolve())
    for name in ("coco_eval.json", "manifest.json"):
        if (root / name).is_file():
            (out / name).write_text((root / name).read_text())
    (out / "subset.json").write_text(json.dumps({"source": str(data_yaml.resolve()), "fraction": float(fraction),
                                                 "seed": int(seed), "train_images": len(keep), "of": len(images),
                                                 "kept": [p.name for p in keep]}, indent=1))
    path = out / "data.yaml"
    path.write_text(yaml.safe_dump({**data, "path": str(out.resolve()), "train": "images/train", "val": "images/val"},
                                   sort_keys=False))
    return path


def train_images(data_yaml: str | Path) -> int:
    """Training images of a data YAML's train folder."""
    data = yaml.safe_load(Path(data_yaml).read_text())
    folder = Path(data["path"]) / data["train"]
    return sum(1 for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def epochs_for_steps(epochs: int, full_images: int, subset_images: int, batch: int) -> int:
    """Epochs on ``subset_images`` that give (at least) the optimizer steps of ``epochs`` on
    ``full_images`` at one step per batch (Ultralytics keeps the last, partial batch)."""
    steps = epochs * math.ceil(full_images / batch)
    return max(1, math.ceil(steps / math.ceil(subset_images / batch)))
