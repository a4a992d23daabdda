"""Issue 55 (detection), conversion: nothing a user owns is deleted, overwritten or mixed without their word.

1. every COCO annotation is checked against what it annotates: refused (naming json + annotation) or
   a recorded skip counted on the console, never a different label;
2. ``detect convert`` outputs are checked against its inputs and against a conversion of other data,
   and locked while written.
(Run folders, val / predict folders and non-finite weights: ``test_reliability_round3_detect_runs.py``.)
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from PIL import Image

from folder_fixtures import hold, tree
from gsdistill.cli import main


def _coco(tmp: Path, anns: list[dict], cats: list[dict] | None = None, name: str = "ann.json") -> Path:
    """Two 200x100 white pages a.jpg (id 1) and b.jpg (id 2), with ``anns``."""
    (tmp / "imgs").mkdir(parents=True, exist_ok=True)
    for f in ("a.jpg", "b.jpg"):
        Image.new("RGB", (200, 100), "white").save(tmp / "imgs" / f)
    base = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [20, 10, 100, 40]},
            {"id": 2, "image_id": 2, "category_id": 2, "bbox": [0, 0, 50, 50]}]
    data = {"images": [{"id": 1, "file_name": "a.jpg", "width": 200, "height": 100},
                       {"id": 2, "file_name": "b.jpg", "width": 200, "height": 100}],
            "categories": cats or [{"id": 1, "name": "text"}, {"id": 2, "name": "title"}],
            "annotations": base + anns}
    path = tmp / name
    path.write_text(json.dumps(data))  # json.dumps writes NaN / Infinity, as a careless producer would
    return path


def _convert(js: Path, out: Path, *extra: str) -> int:
    return main(["detect", "convert", "--coco", str(js), "--images", str(js.parent / "imgs"), "--names", "publaynet",
                 "--out", str(out), *extra])


# --- 1. labels are what the json says, or refused / counted ---------------------------------------

@pytest.mark.parametrize("bbox", [[float("nan"), 10, 50, 20], [10, 10, float("inf"), 20], [10, 10, 50], "10 10 50 20"])
def test_a_bbox_that_is_not_four_finite_numbers_is_refused_naming_json_and_annotation(tmp_path, capsys, bbox):
    js = _coco(tmp_path, [{"id": 77, "image_id": 1, "category_id": 1, "bbox": bbox}])
    assert _convert(js, tmp_path / "out", "--split", "train") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(js) in err and "annotation 77" in err
    assert not (tmp_path / "out").exists()  # nothing written, no empty folder left


def test_a_category_id_defined_twice_is_refused_unless_the_same_definition(tmp_path, capsys):
    cats = [{"id": 1, "name": "text"}, {"id": 2, "name": "title"}, {"id": 1, "name": "figure"}]
    js = _coco(tmp_path, [], cats=cats)
    assert _convert(js, tmp_path / "out", "--split", "train") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(js) in err and not (tmp_path / "out").exists()
    js = _coco(tmp_path, [], cats=[{"id": 1, "name": "text"}, {"id": 2, "name": "title"}, {"id": 1, "name": "text"}])
    assert _convert(js, tmp_path / "out", "--split", "train") == 0
    assert (tmp_path / "out/labels/train/a.txt").read_text() == "0 0.350000 0.300000 0.500000 0.400000\n"  # text
    coco = json.loads((tmp_path / "out/coco/train.json").read_text())
    assert sorted(c["id"] for c in coco["categories"]) == [1, 2]


def test_an_annotation_of_an_unknown_image_is_counted_on_the_console_and_in_the_manifest(tmp_path, capsys):
    js = _coco(tmp_path, [{"id": 5, "image_id": 99, "category_id": 1, "bbox": [1, 1, 5, 5]},
                          {"id": 6, "image_id": 98, "category_id": 1, "bbox": [1, 1, 5, 5]}])
    assert _convert(js, tmp_path / "out", "--split", "train") == 0
    out = capsys.readouterr().out
    assert [int(n) for n in re.findall(r"^(\d+) annotations of .* skipped", out, re.M)] == [2]
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert manifest["unknown_image_annotations"][str(js)] == {"count": 2, "annotation_ids": [5, 6]}
    assert manifest["splits"]["train"]["boxes"] == 2  # the two known ones, unchanged


def test_unusable_boxes_are_recorded_skips_counted_on_the_console(tmp_path, capsys):
    js = _coco(tmp_path, [{"id": 3, "image_id": 1, "category_id": 1, "bbox": [10, 10, 0, 20]},       # zero width
                          {"id": 4, "image_id": 1, "category_id": 1, "bbox": [300, 10, 20, 20]},     # outside
                          {"id": 8, "image_id": 1, "category_id": 2, "bbox": [150, 50, 100, 100]}])  # clipped
    assert _convert(js, tmp_path / "out", "--split", "train") == 0
    assert "train: 2 images, 3 boxes, 2 skipped, 1 clipped" in capsys.readouterr().out
    val = json.loads((tmp_path / "out/manifest.json").read_text())["splits"]["train"]
    assert sorted(s["item"] for s in val["skipped"]) == ["a.jpg ann 3", "a.jpg ann 4"]
    assert val["clipped"][0]["clipped_xyxy"] == [150, 50, 200, 100]
    assert (tmp_path / "out/labels/train/a.txt").read_text().splitlines()[1] == "1 0.875000 0.750000 0.250000 0.500000"


def test_a_json_size_that_is_not_the_image_files_is_refused(tmp_path, capsys):
    js = _coco(tmp_path, [])
    data = json.loads(js.read_text())
    data["images"][1]["width"] = 400  # b.jpg is 200 wide: every box would be scaled by half
    js.write_text(json.dumps(data))
    assert _convert(js, tmp_path / "out") == 2
    assert "b.jpg" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_real_publaynet_examples_still_convert_in_full(shared_data, tmp_path):
    root = shared_data / "publaynet_examples"
    assert main(["detect", "convert", "--coco", str(root / "samples.json"), "--images", str(root / "images"),
                 "--names", "publaynet", "--out", str(tmp_path / "pub")]) == 0
    splits = json.loads((tmp_path / "pub/manifest.json").read_text())["splits"]
    assert sum(s["boxes"] for s in splits.values()) == 193 and sum(s["images"] for s in splits.values()) == 20


# --- 2. convert outputs against inputs and against other conversions ------------------------------

def _shards(tmp_path: Path) -> Path:
    from gsdistill.tuples.store.writer import write_shards
    pages = [{"id": f"p{i}", "doc_id": f"d{i}", "image": Image.new("RGB", (120, 160), "white"), "width": 120,
              "height": 160, "spans": [], "source": "t", "boxes": [{"category": "Table", "bbox": [5, 5, 100, 80]}]}
             for i in range(4)]
    write_shards(pages, tmp_path / "shards", progress=False)
    return tmp_path / "shards"


def test_convert_out_being_or_inside_its_input_is_refused_before_a_byte_is_written(tmp_path, capsys):
    shards = _shards(tmp_path)
    before = tree(shards)
    for out in (shards, shards / "det"):
        assert main(["detect", "convert", "--shards", str(shards), "--out", str(out)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert tree(shards) == before and not (shards / "det").exists()
    js = _coco(tmp_path, [])
    assert _convert(js, tmp_path / "imgs" / "yolo") == 2  # inside --images
    assert _convert(js, tmp_path) == 2  # holding --images and --coco
    assert sorted(p.name for p in (tmp_path / "imgs").iterdir()) == ["a.jpg", "b.jpg"]


def test_a_conversion_of_other_data_is_refused_unless_overwrite(tmp_path, capsys):
    first = _coco(tmp_path / "one", [])
    second = _coco(tmp_path / "two", [{"id": 3, "image_id": 1, "category_id": 2, "bbox": [0, 60, 40, 40]}])
    out = tmp_path / "out"
    assert _convert(first, out, "--split", "train") == 0
    (out / "NOTES.txt").write_text("mine")
    before = tree(out)
    assert _convert(second, out, "--split", "train") == 2  # another json into the same split
    assert _convert(second, out) == 2  # a whole-folder conversion beside it
    assert main(["detect", "convert", "--synthetic", "4", "--out", str(out)]) == 2
    assert tree(out) == before  # untouched
    capsys.readouterr()
    assert _convert(first, out, "--split", "train") == 0  # the same data again: fine
    assert _convert(second, out, "--split", "val") == 0  # another split: the documented one-json-per-split
    assert _convert(second, out, "--split", "train", "--overwrite") == 0
    labels = (out / "labels/train/a.txt").read_text().splitlines()
    assert labels == ["0 0.350000 0.300000 0.500000 0.400000", "1 0.100000 0.800000 0.200000 0.400000"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert {s: st["source"] for s, st in manifest["splits"].items()} == {"train": str(second.resolve()),
                                                                        "val": str(second.resolve())}
    assert (out / "NOTES.txt").read_text() == "mine"  # --overwrite removes only what convert wrote


def test_a_folder_that_is_no_conversion_is_never_written_into(tmp_path):
    js = _coco(tmp_path, [])
    out = tmp_path / "mine"
    (out / "labels").mkdir(parents=True)
    (out / "labels" / "notes.txt").write_text("mine")
    for extra in ((), ("--overwrite",)):
        assert _convert(js, out, *extra) == 2
    assert tree(out) == {"labels/notes.txt": b"mine"}


def test_a_second_writer_of_a_conversion_gets_the_holders_pid(tmp_path, capsys):
    js = _coco(tmp_path, [])
    out = tmp_path / "out"
    holder = hold(out)
    try:
        assert _convert(js, out) == 2
        assert f"PID {holder.pid}" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == [".gsdistill.lock"]
    finally:
        holder.kill()
        holder.wait()
    assert _convert(js, out) == 0  # the lock of a dead process is taken over
