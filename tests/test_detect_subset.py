"""Low-label detection sets: a seeded share of the training pages, held-out pages untouched, the same steps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from PIL import Image

from gsdistill.detect.convert import DatasetError
from gsdistill.detect.subset import epochs_for_steps, subset_data, train_images


def _data(root: Path, n_train: int = 10, n_val: int = 3) -> Path:
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(n):
            Image.new("RGB", (32, 32)).save(root / "images" / split / f"{split}{i}.png")
            (root / "labels" / split / f"{split}{i}.txt").write_text(f"0 0.5 0.5 0.{i + 1} 0.2\n")
    (root / "coco_eval.json").write_text(json.dumps({"val": {"coco_json": "x"}}))
    path = root / "data.yaml"
    path.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "nc": 1,
                                    "names": {0: "text"}}))
    return path


def test_subset_keeps_a_seeded_share_with_its_labels_and_all_held_out_pages(tmp_path):
    data = _data(tmp_path / "full")
    a = subset_data(data, 0.3, seed=0, out=tmp_path / "a")
    b = subset_data(data, 0.3, seed=0, out=tmp_path / "b")
    c = subset_data(data, 0.3, seed=1, out=tmp_path / "c")
    kept = sorted(p.name for p in (tmp_path / "a" / "images" / "train").iterdir())
    assert len(kept) == 3 == train_images(a)
    assert kept == sorted(p.name for p in (tmp_path / "b" / "images" / "train").iterdir())  # seeded
    assert kept != sorted(p.name for p in (tmp_path / "c" / "images" / "train").iterdir())
    for name in kept:  # each image with its own label line
        label = tmp_path / "a" / "labels" / "train" / name.replace(".png", ".txt")
        assert label.read_text() == (tmp_path / "full" / "labels" / "train" / label.name).read_text()
    assert sorted(p.name for p in (tmp_path / "a" / "images" / "val").iterdir()) == ["val0.png", "val1.png", "val2.png"]
    assert json.loads((tmp_path / "a" / "coco_eval.json").read_text()) == {"val": {"coco_json": "x"}}
    assert yaml.safe_load(a.read_text())["path"] == str((tmp_path / "a").resolve())
    # made again with another share: the old links go
    subset_data(data, 0.1, seed=0, out=tmp_path / "a")
    assert train_images(a) == 1 and len(list((tmp_path / "a" / "labels" / "train").iterdir())) == 1


def test_subset_errors_name_the_problem(tmp_path):
    data = _data(tmp_path / "full")
    with pytest.raises(DatasetError, match="fraction must be in"):
        subset_data(data, 0.0, 0, tmp_path / "x")
    (tmp_path / "full" / "labels" / "train" / "train0.txt").unlink()
    with pytest.raises(DatasetError, match="train0.png has no label file"):
        subset_data(data, 1.0, 0, tmp_path / "y")


def test_epochs_for_steps_keeps_the_budget():
    assert epochs_for_steps(12, 251, 25, 16) == 96  # 12 x 16 batches = 192 steps = 96 x 2 batches
    assert epochs_for_steps(16, 251, 25, 16) == 128
    assert epochs_for_steps(3, 10, 10, 4) == 3
    assert epochs_for_steps(1, 100, 7, 8) == 13  # 13 steps on 1 batch per epoch
