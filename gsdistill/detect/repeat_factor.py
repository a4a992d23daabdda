"""Repeat-factor sampling of the training pages (LVIS, Gupta et al. 2019, §3.1) for rare layout classes.

Pages of real documents hold text on nearly every page and tables or figures on a few (the long
benchmark's 1,138 training pages: text on 1,127, tables on 87, figures on 49), so a head sees a table
a hundred times less often than a text block. LVIS repeats each training image by

    r_c = max(1, sqrt(t / f_c))        f_c: the share of training images holding class c
    r_i = max over the classes c in image i of r_c

with one threshold ``t``: a class on a share ``>= t`` of the images is never repeated for its own
sake. LVIS draws the fractional part of ``r_i`` anew each epoch; here it is drawn once, seeded, and
the repeats are links in a new data folder, so Ultralytics' trainer, its cache and every detector
(the stock one included) see the same pages without a custom sampler.
"""
from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import yaml

from gsdistill.detect.checks import data_root, label_path, split_dir
from gsdistill.detect.yolo_folder import IMAGE_SUFFIXES, DatasetError, _link
from gsdistill.output_removal import discard


def split_images(data_yaml: str | Path, data: dict, split: str) -> list[Path]:
    """A split's images as Ultralytics lists them: a folder (searched recursively) or a ``.txt`` of paths."""
    where = split_dir(data_yaml, data, split)
    if where.is_dir():
        return sorted(Path(os.path.abspath(p)) for p in where.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if where.suffix == ".txt" and where.is_file():
        lines = [ln.strip() for ln in where.read_text().splitlines() if ln.strip()]
        return [Path(os.path.abspath(where.parent / ln[2:] if ln.startswith("./") else ln)) for ln in lines]
    raise DatasetError(f"{data_yaml}: {split} entry {data[split]!r} is neither a folder of images nor a .txt of paths")


def repeat_factors(classes_per_image: list[set[int]], threshold: float) -> tuple[list[float], dict[int, float],
                                                                                   dict[int, float]]:
    """(r_i per image, f_c per class, r_c per class) of LVIS repeat-factor sampling at ``threshold``."""
    n = len(classes_per_image)
    seen = sorted(set().union(*classes_per_image)) if n else []
    freq = {c: sum(c in s for s in classes_per_image) / n for c in seen}
    r_class = {c: max(1.0, math.sqrt(threshold / f)) for c, f in freq.items()}
    return [max((r_class[c] for c in s), default=1.0) for s in classes_per_image], freq, r_class


def _classes(label: Path, image: Path, data_yaml: Path) -> set[int]:
    if not label.is_file():
        raise DatasetError(f"{data_yaml}: training image {image} has no label file {label}")
    return {int(float(line.split()[0])) for line in label.read_text().splitlines() if line.strip()}


def repeat_factor_data(data_yaml: str | Path, threshold: float, seed: int, out: str | Path) -> Path:
    """A data YAML in ``out`` whose training pages are ``data_yaml``'s, each linked ``floor(r_i)`` times
    plus once more with probability ``r_i - floor(r_i)`` (seeded); the val / test splits, ``coco_eval.json``
    and ``manifest.json`` stay ``data_yaml``'s. ``repeat_factors.json`` records the frequencies and factors."""
    if not float(threshold) > 0.0:
        raise DatasetError(f"repeat factors of {data_yaml}: threshold must be > 0, got {threshold}")
    data_yaml, out = Path(data_yaml), Path(out)
    data = yaml.safe_load(data_yaml.read_text())
    images = split_images(data_yaml, data, "train")
    if not images:
        raise DatasetError(f"{data_yaml}: no training images")
    labels = [label_path(p) for p in images]
    r_img, freq, r_class = repeat_factors([_classes(lb, im, data_yaml) for im, lb in zip(images, labels)],
                                          float(threshold))
    rng = random.Random(seed)
    copies = [math.floor(r) + (rng.random() < r - math.floor(r)) for r in r_img]
    for sub in ("images/train", "labels/train"):
        folder = out / sub
        if folder.exists() or folder.is_symlink():  # made before, maybe at another threshold: start over
            kept = discard(folder).kept  # what gsdistill wrote there (links to the images), never through a link
            if kept:
                raise DatasetError(f"{folder}: holds files gsdistill did not write ({', '.join(kept[:3])}); move them")
        folder.mkdir(parents=True, exist_ok=True)
    for i, (img, label, k) in enumerate(zip(images, labels, copies)):
        for j in range(k):
            # the index keeps same-named pages of two sub-folders apart; ".rJ" names the extra copies
            stem = f"{i:06d}_{img.stem}" + (f".r{j}" if j else "")
            _link(img, out / "images" / "train" / (stem + img.suffix))
            _link(label, out / "labels" / "train" / (stem + ".txt"))
    names = data.get("names", {})
    name = (lambda c: names[c]) if isinstance(names, (dict, list)) and names else str
    (out / "repeat_factors.json").write_text(json.dumps({
        "source": str(data_yaml.resolve()), "threshold": float(threshold), "seed": int(seed),
        "train_images": len(images), "repeated_images": sum(copies),
        "classes": {str(name(c)): {"image_share": round(freq[c], 4), "repeat_factor": round(r_class[c], 3)}
                    for c in sorted(freq)}}, indent=1))
    root = data_root(data_yaml, data)
    split = {k: os.path.abspath(root / data[k]) for k in ("val", "test") if data.get(k)}
    for name_ in ("coco_eval.json", "manifest.json"):
        if (data_yaml.parent / name_).is_file():
            (out / name_).write_text((data_yaml.parent / name_).read_text())
    path = out / "data.yaml"
    path.write_text(yaml.safe_dump({**data, **split, "path": os.path.abspath(out), "train": "images/train"},
                                   sort_keys=False))
    return path
