"""Converters to the Ultralytics layout, data checks and the pycocotools scoring path (no training)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from PIL import Image

from gsdistill.tuples.labels import DOCLAYNET_CLASSES, PUBLAYNET_CLASSES, PUBLAYNET_TO_DOCLAYNET
from gsdistill.detect.checks import check_yolo_dataset
from gsdistill.detect.convert import DatasetError, coco_to_yolo, convert_release, pages_to_yolo
from gsdistill.detect.evaluate import coco_eval

REPO = Path(__file__).resolve().parents[1]


def _coco(tmp: Path, images: list[tuple[str, int, int]], anns: list[tuple[str, int, list]],
          cats=("text", "title", "list", "table", "figure"), json_name="ann.json", img_dir="imgs",
          cat_ids: list[int] | None = None) -> Path:
    (tmp / img_dir).mkdir(parents=True, exist_ok=True)
    for name, w, h in images:
        Image.new("RGB", (w, h), "white").save(tmp / img_dir / name)
    data = {"images": [{"id": i + 10, "file_name": n, "width": w, "height": h} for i, (n, w, h) in enumerate(images)],
            "categories": [{"id": (cat_ids or range(1, 99))[i], "name": c} for i, c in enumerate(cats)],
            "annotations": [{"id": k + 1, "image_id": [n for n, _, _ in images].index(img) + 10,
                             "category_id": (cat_ids or range(1, 99))[cat - 1], "bbox": box, "iscrowd": 0, "area": box[2] * box[3]}
                            for k, (img, cat, box) in enumerate(anns)]}
    path = tmp / json_name
    path.write_text(json.dumps(data))
    return path


def test_coco_to_yolo_labels_match_formula(tmp_path):
    js = _coco(tmp_path, [("a.jpg", 200, 100), ("b.jpg", 100, 100), ("c.jpg", 50, 50)],
               [("a.jpg", 1, [20, 10, 100, 40]), ("a.jpg", 4, [150, 50, 80, 80]),  # 2nd clipped at the right edge
                ("b.jpg", 5, [0, 0, 50, 50]), ("b.jpg", 2, [99.5, 99.5, 5, 5])])  # last: no area inside
    data = coco_to_yolo(js, tmp_path / "imgs", tmp_path / "out", PUBLAYNET_CLASSES, split="train")
    lines = (tmp_path / "out/labels/train/a.txt").read_text().split("\n")
    assert lines[0] == "0 0.350000 0.300000 0.500000 0.400000"  # cx=(20+120)/2/200, cy=(10+50)/2/100
    assert lines[1] == "3 0.875000 0.750000 0.250000 0.500000"  # x1 clipped 230 -> 200
    assert (tmp_path / "out/images/train/a.jpg").resolve() == (tmp_path / "imgs/a.jpg").resolve()
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    reasons = [s["reason"] for s in manifest["splits"]["train"]["skipped"]]
    assert manifest["splits"]["train"]["images"] == 2 and manifest["splits"]["train"]["boxes"] == 3
    assert "box without area after clipping" in reasons and any("no usable box" in r for r in reasons)  # c.jpg
    side = json.loads((tmp_path / "out/coco_eval.json").read_text())["train"]
    assert side["image_ids"] == {"a": 10, "b": 11} and side["category_ids"] == [1, 2, 3, 4, 5]
    spec = yaml.safe_load(Path(data).read_text())
    assert spec["nc"] == 5 and spec["names"][4] == "figure"


def test_coco_to_yolo_bad_input(tmp_path):
    js = _coco(tmp_path, [("a.jpg", 64, 64)], [("a.jpg", 1, [1, 1, 30, 30])], cats=("text", "marginalia"))
    with pytest.raises(DatasetError, match="'marginalia'.*not one of the classes"):
        coco_to_yolo(js, tmp_path / "imgs", tmp_path / "o1", PUBLAYNET_CLASSES)
    data = json.loads(js.read_text())
    data["images"].append({"id": 99, "file_name": "gone.jpg", "width": 64, "height": 64})
    js.write_text(json.dumps(data))
    cmap = {"marginalia": None}
    with pytest.raises(DatasetError, match="gone.jpg"):
        coco_to_yolo(js, tmp_path / "imgs", tmp_path / "o2", PUBLAYNET_CLASSES, split="val", category_map=cmap)
    coco_to_yolo(js, tmp_path / "imgs", tmp_path / "o3", PUBLAYNET_CLASSES, split="val", category_map=cmap,
                 missing_images="skip")
    skipped = json.loads((tmp_path / "o3/manifest.json").read_text())["splits"]["val"]["skipped"]
    assert [s["reason"] for s in skipped] == ["image file missing"]


def test_convert_release_layouts(tmp_path):
    dl = tmp_path / "DocLayNet_core"
    (dl / "COCO").mkdir(parents=True)
    for split, n in (("train", 3), ("val", 2), ("test", 1)):
        _coco(dl, [(f"{split}{i}.png", 80, 100) for i in range(n)],
              [(f"{split}{i}.png", 1 + i % 11, [5, 5, 40, 30]) for i in range(n)],
              cats=DOCLAYNET_CLASSES, json_name=f"COCO/{split}.json", img_dir="PNG")
    data = yaml.safe_load(convert_release(dl, "doclaynet", tmp_path / "dl").read_text())
    assert data["test"] == "images/test" and data["names"][10] == "Title"
    assert sorted(p.name for p in (tmp_path / "dl/labels/val").iterdir()) == ["val0.txt", "val1.txt"]
    pub = tmp_path / "publaynet"
    for split in ("train", "val"):
        _coco(pub, [(f"{split}.jpg", 90, 90)], [(f"{split}.jpg", 5, [10, 10, 20, 20])],
              json_name=f"{split}.json", img_dir=split)
    convert_release(pub, "publaynet", tmp_path / "pl", names=DOCLAYNET_CLASSES, category_map=PUBLAYNET_TO_DOCLAYNET)
    picture = DOCLAYNET_CLASSES.index("Picture")
    assert (tmp_path / "pl/labels/val/val.txt").read_text().split()[0] == str(picture)
    with pytest.raises(DatasetError, match="no doclaynet split files"):
        convert_release(tmp_path / "nothing", "doclaynet", tmp_path / "x")


def _page(pid: str, doc: str, boxes: list[tuple[str, list]]) -> dict:
    return {"id": pid, "doc_id": doc, "image": Image.new("RGB", (120, 160), "white"), "width": 120,
            "height": 160, "spans": [{"text": "words", "bbox": [5, 5, 50, 15], "category": None}], "source": "test", "boxes": [{"category": c, "bbox": b} for c, b in boxes]}


def test_pages_to_yolo_splits_by_document_and_round_trips(tmp_path):
    pages = [_page(f"d{d}-p{p}", f"d{d}", [("Text", [10, 20, 110, 60]), ("Title", [10, 2, 60, 12])])
             for d in range(5) for p in range(2)]
    pages.append(_page("empty", "d9", []))
    data = pages_to_yolo(pages, tmp_path / "out", val_fraction=0.4, seed=1)
    splits = {p.stem: p.parent.name for p in (tmp_path / "out/images").rglob("*.png")}
    for d in range(5):
        assert splits[f"d{d}-p0"] == splits[f"d{d}-p1"]  # one document never straddles train/val
    assert sum(v == "val" for v in splits.values()) == 4  # round(5 docs * 0.4) = 2 docs
    coco = json.loads((tmp_path / "out/coco/val.json").read_text())
    assert coco["annotations"][0]["bbox"] == [10.0, 20.0, 100.0, 40.0]
    cls, cx, cy, w, h = (tmp_path / "out/labels/val" / f"{coco['images'][0]['file_name'][:-4]}.txt"
                         ).read_text().split("\n")[0].split()
    assert int(cls) == DOCLAYNET_CLASSES.index("Text")
    assert [float(cx) * 120, float(cy) * 160, float(w) * 120, float(h) * 160] == pytest.approx([60, 40, 100, 40])
    skipped = json.loads((tmp_path / "out/manifest.json").read_text())["splits"]["train"]["skipped"]
    assert skipped[0]["item"] == "empty"
    assert check_yolo_dataset(data)["val"] == {"images": 4, "boxes": 8, "empty_labels": 0, "unreadable": []}
    with pytest.raises(DatasetError, match="'Marginalia' is not one of the classes"):
        pages_to_yolo([_page("x", "x", [("Marginalia", [1, 1, 9, 9])])], tmp_path / "bad")


def test_check_yolo_dataset_errors(tmp_path):
    pages = [_page(f"p{i}", f"d{i}", [("Text", [10, 20, 110, 60])]) for i in range(4)]
    data = pages_to_yolo(pages, tmp_path / "ds", val_fraction=0.5)
    label = next((tmp_path / "ds/labels/train").iterdir())
    label.write_text("")
    with pytest.raises(DatasetError, match=f"{label.name}: empty label file"):
        check_yolo_dataset(data)
    assert check_yolo_dataset(data, allow_empty_labels=True)["train"]["empty_labels"] == 1
    label.write_text("0 0.5 0.5 0.2 0.2\n11 0.5 0.5 0.2 0.2\n")
    with pytest.raises(DatasetError, match=f"{label.name}:2: class 11 is outside"):
        check_yolo_dataset(data)
    label.unlink()
    with pytest.raises(DatasetError, match="no label file"):
        check_yolo_dataset(data)
    with pytest.raises(DatasetError, match="data YAML not found"):
        check_yolo_dataset(tmp_path / "nope.yaml")


def test_coco_eval_scores_ground_truth_as_perfect_and_maps_ids(tmp_path):
    # json category ids unlike Ultralytics' (class index + 1), listed in another order than the classes
    js = _coco(tmp_path, [("a.jpg", 200, 200), ("b.jpg", 200, 200)],
               [("a.jpg", 1, [10, 100, 150, 80]), ("a.jpg", 2, [10, 10, 80, 40]), ("b.jpg", 2, [20, 20, 60, 60])],
               cats=("table", "text"), cat_ids=[40, 7])
    coco_to_yolo(js, tmp_path / "imgs", tmp_path / "out", PUBLAYNET_CLASSES, split="val")
    side = json.loads((tmp_path / "out/coco_eval.json").read_text())["val"]
    assert side["category_ids"] == [7, None, None, 40, None]
    gt = json.loads(js.read_text())
    stems = {i["id"]: Path(i["file_name"]).stem for i in gt["images"]}
    ul_cat = {40: PUBLAYNET_CLASSES.index("table") + 1, 7: PUBLAYNET_CLASSES.index("text") + 1}
    preds = [{"file_name": stems[a["image_id"]] + ".jpg", "category_id": ul_cat[a["category_id"]],
              "bbox": a["bbox"], "score": 0.9} for a in gt["annotations"]]
    perfect = coco_eval(preds, side, PUBLAYNET_CLASSES)
    assert perfect["coco_mAP50-95"] == pytest.approx(1.0)
    assert perfect["per_class"]["table"]["AP50"] == pytest.approx(1.0) and set(perfect["per_class"]) == {"text", "table"}
    preds[0]["bbox"] = [10, 100, 150, 30]  # table box: IoU 30/80 = 0.375 < 0.5 -> a miss
    worse = coco_eval(preds, side, PUBLAYNET_CLASSES)
    assert worse["per_class"]["table"]["AP50"] == pytest.approx(0.0)
    assert worse["per_class"]["text"]["AP50-95"] == pytest.approx(1.0)
    assert worse["coco_mAP50"] == pytest.approx(0.5)  # mean over the 2 categories with ground truth


def test_data_yaml_templates_match_label_sets():
    for name, classes in (("doclaynet", DOCLAYNET_CLASSES), ("publaynet", PUBLAYNET_CLASSES)):
        spec = yaml.safe_load((REPO / "configs/detect/data" / f"{name}.yaml").read_text())
        assert [spec["names"][i] for i in range(spec["nc"])] == list(classes)


def test_real_publaynet_examples(shared_data, tmp_path):
    root = shared_data / "publaynet_examples"
    data = coco_to_yolo(root / "samples.json", root / "images", tmp_path / "pub", PUBLAYNET_CLASSES,
                        val_fraction=0.25, seed=0)
    report = check_yolo_dataset(data)
    assert report["train"]["images"] + report["val"]["images"] == 20
    assert report["train"]["boxes"] + report["val"]["boxes"] == 193  # SOURCE.md: 193 annotations
    assert report["val"]["images"] == 5


def test_many_to_one_category_map_scores_against_merged_json(tmp_path):
    js = _coco(tmp_path, [("a.jpg", 200, 200)],
               [("a.jpg", 1, [10, 10, 80, 40]), ("a.jpg", 2, [10, 100, 150, 80])], cats=("paragraph", "abstract"))
    cmap = {"paragraph": "Text", "abstract": "Text"}
    coco_to_yolo(js, tmp_path / "imgs", tmp_path / "out", DOCLAYNET_CLASSES, split="val", category_map=cmap)
    side = json.loads((tmp_path / "out/coco_eval.json").read_text())["val"]
    assert side["coco_json"].endswith("coco/val.json") and side["category_ids"] == list(range(1, 12))
    text = DOCLAYNET_CLASSES.index("Text") + 1
    preds = [{"file_name": "a.jpg", "category_id": text, "bbox": b, "score": 0.8}
             for b in ([10, 10, 80, 40], [10, 100, 150, 80])]
    res = coco_eval(preds, side, DOCLAYNET_CLASSES)
    assert res["coco_mAP50-95"] == pytest.approx(1.0) and list(res["per_class"]) == ["Text"]


def test_cli_convert_from_shards_and_real_docbank(shared_data, tmp_path):
    from gsdistill.tuples.store.writer import write_shards
    from gsdistill.detect.cli import main

    pages = [_page(f"p{i}", f"d{i}", [("Table", [5, 5, 100, 80]), ("Caption", [5, 90, 100, 100])]) for i in range(4)]
    write_shards(pages, tmp_path / "shards", progress=False)
    assert main(["convert", "--shards", str(tmp_path / "shards"), "--val-fraction", "0.25",
                 "--out", str(tmp_path / "from_shards")]) == 0
    assert check_yolo_dataset(tmp_path / "from_shards/data.yaml")["train"] == {"images": 3, "boxes": 6,
                                                                               "empty_labels": 0, "unreadable": []}
    src = tmp_path / "docbank"  # two real DocBank pages (token files + renders), linked
    (src / "annotations").mkdir(parents=True)
    (src / "images").mkdir()
    root = shared_data / "docbank_samples"
    for txt in sorted((root / "annotations").iterdir())[:2]:
        (src / "annotations" / txt.name).symlink_to(txt)
        img = root / "images" / f"{txt.stem}_ori.jpg"
        (src / "images" / img.name).symlink_to(img)
    assert main(["convert", "--docbank", str(src), "--val-fraction", "0.5", "--out", str(tmp_path / "db")]) == 0
    report = check_yolo_dataset(tmp_path / "db/data.yaml")
    assert report["train"]["images"] + report["val"]["images"] == 2 and report["train"]["boxes"] > 3


def test_coco_scored_against_the_clipped_boxes_that_were_trained_on(tmp_path):
    """A box reaching past the image trains clipped; the perfect prediction of that box must score 1.0."""
    js = _coco(tmp_path, [("a.jpg", 200, 100)],
               [("a.jpg", 1, [150, 20, 100, 40]),  # x 150..250 on a 200 px image: trained as 150..200
                ("a.jpg", 2, [10, 10, 40, -20]),   # negative height: not a COCO box
                ("a.jpg", 4, [10, 60, 60, 30])])
    data = json.loads(js.read_text())
    data["annotations"].append({"id": 99, "image_id": 12345, "category_id": 1, "bbox": [1, 1, 5, 5]})
    js.write_text(json.dumps(data))
    coco_to_yolo(js, tmp_path / "imgs", tmp_path / "out", PUBLAYNET_CLASSES, split="val")
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    val = manifest["splits"]["val"]
    assert val["boxes"] == 2 and val["clipped"] == [{"item": "a.jpg ann 1", "bbox_xyxy": [150, 20, 250, 60],
                                                      "clipped_xyxy": [150, 20, 200, 60]}]
    assert any("negative width or height" in s["reason"] for s in val["skipped"])
    assert manifest["unknown_image_annotations"][str(js)]["annotation_ids"] == [99]
    side = json.loads((tmp_path / "out/coco_eval.json").read_text())["val"]
    preds = [{"file_name": "a.jpg", "category_id": 1, "bbox": [150, 20, 50, 40], "score": 0.9},
             {"file_name": "a.jpg", "category_id": 4, "bbox": [10, 60, 60, 30], "score": 0.9}]
    assert coco_eval(preds, side, PUBLAYNET_CLASSES)["coco_mAP50-95"] == pytest.approx(1.0)
