"""Checks on inputs before Ultralytics sees them, so bad data fails with the file and the problem.

Ultralytics itself warns and drops corrupt labels, treats a missing label file as background and
may try to download a data set whose folders are missing; here each of those is an error instead.
An image that cannot be decoded (truncated, not an image, under 10 pixels a side) is a recorded
skip: listed with its reason in the check's report, and left out of the image lists Ultralytics
reads (:func:`readable_data_yaml`), so the count it trains on is the count reported, and it never
"restores" (rewrites) a user's truncated JPEG.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from gsdistill.detect.yolo_folder import IMAGE_SUFFIXES, DatasetError
from gsdistill.detect.image_check import DecodedImages


def read_data_yaml(data_yaml: str | Path) -> dict:
    path = Path(data_yaml)
    if not path.is_file():
        raise DatasetError(f"data YAML not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or "names" not in data or "train" not in data or "val" not in data:
        raise DatasetError(f"{path}: a data YAML needs 'train', 'val' and 'names' keys")
    names = data["names"]
    data["names"] = [names[k] for k in sorted(names)] if isinstance(names, dict) else list(names)
    if "download" in data:
        raise DatasetError(f"{path}: has a 'download' key; gsdistill never downloads data at run time")
    return data


def data_root(data_yaml: str | Path, data: dict) -> Path:
    """The folder the YAML's split paths are relative to (``path``, else the YAML's own folder)."""
    root = Path(data.get("path") or Path(data_yaml).parent)
    return root if root.is_absolute() else Path(data_yaml).parent / root


def split_dir(data_yaml: str | Path, data: dict, split: str) -> Path:
    return data_root(data_yaml, data) / data[split]


def _check_label(label: Path, nc: int, names: list[str]) -> int:
    """Number of boxes in ``label``; raises DatasetError on a malformed line or class outside names."""
    lines = [ln for ln in label.read_text().splitlines() if ln.strip()]
    for no, line in enumerate(lines, 1):
        parts = line.split()
        try:
            cls, coords = int(parts[0]), [float(v) for v in parts[1:]]
        except (ValueError, IndexError):
            raise DatasetError(f"{label}:{no}: not 'class cx cy w h': {line!r}") from None
        if len(coords) != 4:
            raise DatasetError(f"{label}:{no}: expected 5 numbers (class cx cy w h), got {len(parts)}")
        if not 0 <= cls < nc:
            raise DatasetError(f"{label}:{no}: class {cls} is outside the data YAML's {nc} classes {names}")
        if any(not 0.0 <= v <= 1.0 for v in coords) or coords[2] <= 0 or coords[3] <= 0:
            raise DatasetError(f"{label}:{no}: box {coords} is not normalised to (0, 1]")
    return len(lines)


def label_path(image: Path) -> Path:
    """Ultralytics' rule: the last ``/images/`` of the path becomes ``/labels/``, suffix ``.txt``."""
    parts = list(image.parts)
    if "images" not in parts[:-1]:
        return image.with_suffix(".txt")
    idx = len(parts) - 2 - parts[-2::-1].index("images")
    return Path(*parts[:idx], "labels", *parts[idx + 1:]).with_suffix(".txt")


def check_yolo_dataset(data_yaml: str | Path, splits: tuple[str, ...] = ("train", "val"),
                       allow_empty_labels: bool = False) -> dict:
    """Validate a detection data set; return ``{split: {"images", "boxes", "empty_labels", "unreadable"}}``.

    Errors (naming the file): missing data YAML or image folder, a split without (readable) images,
    an image without a label file, a malformed label line, a class id outside the YAML's names, and,
    unless ``allow_empty_labels``, an empty label file (a page with no box would train as background).
    An image that does not decode is skipped: ``unreadable`` lists ``{"image", "reason"}``, and
    ``images`` counts only the readable ones.
    """
    data = read_data_yaml(data_yaml)
    names = data["names"]
    if data.get("nc") is not None and int(data["nc"]) != len(names):
        raise DatasetError(f"{data_yaml}: nc={data['nc']} but {len(names)} names")
    report, decoded = {}, DecodedImages(data_yaml)
    for split in splits:
        if split not in data:
            continue
        folder = split_dir(data_yaml, data, split)
        if not folder.is_dir():
            raise DatasetError(f"{data_yaml}: {split} image folder {folder} does not exist")
        images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise DatasetError(f"{data_yaml}: {split} image folder {folder} holds no images")
        for img in images:
            if not img.exists():
                raise DatasetError(f"{img}: image missing (broken link to {img.resolve()})")
        problems = decoded.problems(images)
        unreadable = [{"image": str(img), "reason": why} for img, why in zip(images, problems) if why]
        images = [img for img, why in zip(images, problems) if not why]
        if not images:
            raise DatasetError(f"{data_yaml}: none of the {len(unreadable)} {split} images in {folder} can be read "
                               f"(e.g. {unreadable[0]['image']}: {unreadable[0]['reason']})")
        boxes, empty = 0, []
        for img in images:
            label = label_path(img)
            if not label.is_file():
                raise DatasetError(f"{img}: no label file {label}")
            n = _check_label(label, len(names), names)
            if n == 0:
                if not allow_empty_labels:
                    raise DatasetError(f"{label}: empty label file (no boxes); remove the image or set "
                                       "data_check.allow_empty_labels=true to train it as background")
                empty.append(str(label))
            boxes += n
        report[split] = {"images": len(images), "boxes": boxes, "empty_labels": len(empty), "unreadable": unreadable}
    decoded.save()
    return report


def skipped_images(report: dict) -> list[dict]:
    """``{"split", "image", "reason"}`` of every image the check skipped."""
    return [{"split": split, **item} for split, st in report.items() for item in st.get("unreadable", [])]


def readable_data_yaml(data_yaml: str | Path, report: dict, out_dir: Path) -> Path:
    """``data_yaml`` itself when every image decodes; else a copy in ``out_dir`` whose checked splits
    are lists of the readable images (Ultralytics reads a ``.txt`` of image paths as a split)."""
    if not skipped_images(report):
        return Path(data_yaml)
    data = yaml.safe_load(Path(data_yaml).read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, st in report.items():
        bad = {item["image"] for item in st["unreadable"]}
        folder = split_dir(data_yaml, data, split)
        # absolute, not resolved: a label is found beside the image path as given (images/ -> labels/)
        kept = sorted(os.path.abspath(p) for p in folder.rglob("*")
                      if p.suffix.lower() in IMAGE_SUFFIXES and str(p) not in bad)
        listing = out_dir / f"{split}_images.txt"
        listing.write_text("\n".join(kept) + "\n")
        data[split] = os.path.abspath(listing)
    data["path"] = os.path.abspath(data_root(data_yaml, data))  # the other splits stay where they were
    path = out_dir / "data_readable.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
