"""Repeat-factor sampling (LVIS): pages with rare classes linked r_i times, the formula's numbers, the trainer's count."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from gsdistill.config import load_config
from gsdistill.detect.convert import DatasetError
from gsdistill.detect.checks import label_path
from gsdistill.detect.repeat_factor import repeat_factor_data, repeat_factors


def _data(root: Path, train_classes: list[list[int]], n_val: int = 2) -> Path:
    """A YOLO folder whose training page i holds one box of each class in ``train_classes[i]``."""
    for split, pages in (("train", train_classes), ("val", [[0]] * n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i, classes in enumerate(pages):
            Image.new("RGB", (64, 64), "white").save(root / "images" / split / f"{split}{i}.png")
            lines = [f"{c} 0.{2 + j} 0.5 0.1 0.1" for j, c in enumerate(classes)]
            (root / "labels" / split / f"{split}{i}.txt").write_text("".join(ln + "\n" for ln in lines))
    (root / "coco_eval.json").write_text(json.dumps({"val": {"coco_json": "x"}}))
    path = root / "data.yaml"
    path.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "nc": 3,
                                    "names": {0: "text", 1: "table", 2: "figure"}}))
    return path


def test_repeat_factors_follow_the_lvis_formula():
    pages = [{0}] * 6 + [{0, 1}] * 3 + [{0, 2}]  # text on 10 of 10 pages, tables on 3, figures on 1
    r_img, freq, r_class = repeat_factors(pages, threshold=0.5)
    assert freq == {0: 1.0, 1: 0.3, 2: 0.1}
    assert r_class[0] == 1.0 and math.isclose(r_class[1], math.sqrt(0.5 / 0.3))
    assert math.isclose(r_class[2], math.sqrt(5.0))
    # a page takes its rarest class's factor; an empty page (background) is seen once
    assert r_img == [1.0] * 6 + [r_class[1]] * 3 + [r_class[2]]
    assert repeat_factors([set(), {0}], 0.5)[0] == [1.0, 1.0]
    # a class on a share >= t of the pages is never repeated for its own sake
    assert repeat_factors(pages, threshold=0.1)[0] == [1.0] * 10


def test_repeat_factor_data_links_each_page_floor_or_ceil_of_r_with_its_labels(tmp_path):
    classes = [[0]] * 6 + [[0, 1]] * 3 + [[0, 2]]
    data = _data(tmp_path / "full", classes)
    out = repeat_factor_data(data, 0.5, seed=0, out=tmp_path / "rfs")
    rec = json.loads((tmp_path / "rfs" / "repeat_factors.json").read_text())
    assert rec["classes"]["table"] == {"image_share": 0.3, "repeat_factor": round(math.sqrt(0.5 / 0.3), 3)}
    assert rec["classes"]["text"]["repeat_factor"] == 1.0
    images = sorted((tmp_path / "rfs" / "images" / "train").iterdir())
    assert len(images) == rec["repeated_images"]
    src = [tmp_path / "full" / "images" / "train" / f"train{i}.png" for i in range(len(classes))]
    copies = [sum(p.resolve() == s.resolve() for p in images) for s in src]
    assert copies[:6] == [1] * 6  # text-only pages once
    assert all(c in (1, 2) for c in copies[6:9])  # sqrt(5/3) = 1.29: once or twice
    assert copies[9] in (2, 3)  # sqrt(5) = 2.24
    for img in images:  # every link beside the label of the page it shows
        page = img.resolve().stem
        assert label_path(img).read_text() == (tmp_path / "full" / "labels" / "train" / f"{page}.txt").read_text()
    spec = yaml.safe_load(out.read_text())
    assert spec["path"] == str((tmp_path / "rfs").resolve()) and spec["train"] == "images/train"
    assert spec["val"] == str((tmp_path / "full" / "images" / "val").resolve())  # held-out pages untouched
    assert json.loads((tmp_path / "rfs" / "coco_eval.json").read_text()) == {"val": {"coco_json": "x"}}
    repeat_factor_data(data, 0.5, seed=0, out=tmp_path / "rfs2")  # seeded: the same links again
    assert sorted(p.name for p in (tmp_path / "rfs2" / "images" / "train").iterdir()) == [p.name for p in images]
    repeat_factor_data(data, 0.01, seed=0, out=tmp_path / "rfs")  # made again: the old links go
    assert len(list((tmp_path / "rfs" / "images" / "train").iterdir())) == len(classes)


def test_repeat_factor_errors_name_the_problem(tmp_path):
    data = _data(tmp_path / "full", [[0], [1]])
    with pytest.raises(DatasetError, match="threshold must be > 0"):
        repeat_factor_data(data, 0.0, 0, tmp_path / "x")
    (tmp_path / "full" / "labels" / "train" / "train1.txt").unlink()
    with pytest.raises(DatasetError, match="train1.png has no label file"):
        repeat_factor_data(data, 0.5, 0, tmp_path / "y")


class _Seen(Exception):
    """Stops the run once the trainer has built its training set."""


def test_train_head_trains_on_the_repeated_pages(tmp_path):
    from gsdistill.detect.pipeline import train_head
    from gsdistill.models.backbone import create_backbone, save_backbone
    tiny = {"name": "vit_tiny_patch16_224", "depth": 1, "embed_dim": 32, "num_heads": 2}
    data = _data(tmp_path / "full", [[0]] * 6 + [[0, 1]] * 3 + [[0, 2]])
    torch.manual_seed(0)
    bb = save_backbone(create_backbone(tiny), tiny, tmp_path / "bb")
    cfg = load_config("detect", "cpu_smoke", [f"data={data}", f"backbone={bb}", f"project={tmp_path / 'runs'}",
                                              "epochs=1", "imgsz=64", "repeat_threshold=0.5"])
    seen = {}

    def count(trainer):
        run = Path(trainer.save_dir)  # read now: a run stopped before its first checkpoint is removed
        seen["pages"] = len(trainer.train_loader.dataset)
        seen["data"] = Path(trainer.args.data)
        seen["record"] = json.loads((run / "data_repeat" / "repeat_factors.json").read_text())
        seen["config"] = yaml.safe_load((run / "config.yaml").read_text())
        raise _Seen()

    with pytest.raises(_Seen):
        train_head(cfg, callbacks={"on_train_epoch_start": [count]})
    assert seen["pages"] == seen["record"]["repeated_images"] > 10
    assert seen["data"].parent.name == "data_repeat"
    assert seen["config"]["repeat_threshold"] == 0.5  # the resolved config keeps it
