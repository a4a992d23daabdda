"""Issue 33 rows 3 and 9 (detection): an image that does not decode is a recorded skip (named with its
reason in the data check, report.json and one stderr line; never trained, never rewritten by
Ultralytics); a damaged ``backbone.json`` is named; a failed ``detect train`` leaves no run folder."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from gsdistill.cli import main
from gsdistill.detect.checks import check_yolo_dataset
from gsdistill.detect.convert import DatasetError, pages_to_yolo
from gsdistill.models.backbone import create_backbone, save_backbone
from gsdistill.tuples.sources.synthetic import generate_pages

TINY = {"name": "vit_tiny_patch16_224", "depth": 1, "embed_dim": 32, "num_heads": 2}
FAST = ["--config", "cpu_smoke", "imgsz=64", "adapter_channels=16", "random_backbone.depth=1",
        "random_backbone.embed_dim=32", "random_backbone.num_heads=2"]


@pytest.fixture()
def data(tmp_path) -> Path:
    return pages_to_yolo(generate_pages(8, seed=3, width=200, height=256), tmp_path / "det", val_fraction=0.25)


def _truncate(data: Path, split: str = "train") -> Path:
    image = sorted((data.parent / "images" / split).iterdir())[0]
    image.write_bytes(image.read_bytes()[:500])
    return image


def test_data_check_skips_a_truncated_image_with_its_reason(data, tmp_path):
    from gsdistill.detect.checks import readable_data_yaml, skipped_images
    bad = _truncate(data)
    n = len(list(bad.parent.iterdir()))
    report = check_yolo_dataset(data)
    assert report["train"]["images"] == n - 1
    assert report["train"]["unreadable"] == [{"image": str(bad), "reason": "unreadable image (OSError: image file "
                                                                         "is truncated)"}]
    assert skipped_images(report) == [{"split": "train", **report["train"]["unreadable"][0]}]
    derived = readable_data_yaml(data, report, tmp_path / "run_data")
    spec = yaml.safe_load(derived.read_text())
    listed = Path(spec["train"]).read_text().split()
    assert len(listed) == n - 1 and str(bad) not in listed and all(Path(p).is_file() for p in listed)
    assert readable_data_yaml(data, check_yolo_dataset(data, splits=("val",)), tmp_path / "x") == data


def test_a_split_with_no_readable_image_is_an_error(data):
    for image in (data.parent / "images" / "val").iterdir():
        image.write_bytes(b"not an image")
    with pytest.raises(DatasetError, match=r"none of the 4 val images .* can be read \(e.g. .*png: unreadable image "
                                          r"\(UnidentifiedImageError: cannot identify image file\)\)"):
        check_yolo_dataset(data)


def test_detect_train_counts_the_skipped_image_in_report_json(data, tmp_path, capsys):
    bad = _truncate(data)
    before, n = bad.read_bytes(), len(list(bad.parent.iterdir()))
    runs = tmp_path / "runs"
    assert main(["detect", "train", *FAST, f"data={data}", f"project={runs}", "val_during_training=false"]) == 0
    err = capsys.readouterr().err
    report_path = runs / "head_only" / "report.json"
    assert f"[detect] skipping 1 of {n} train images that do not decode (listed in {report_path})" in err
    report = json.loads((runs / "head_only" / "report.json").read_text())
    assert report["train_images"] == n - 1 and report["images_skipped"] == 1
    assert report["skipped_images"][0]["image"] == str(bad) and "truncated" in report["skipped_images"][0]["reason"]
    assert bad.read_bytes() == before  # Ultralytics never saw it, so never "restored" (rewrote) it


def test_damaged_backbone_json_is_named_and_leaves_no_run_folder(data, tmp_path, capsys):
    torch.manual_seed(0)
    bb = save_backbone(create_backbone(TINY), TINY, tmp_path / "bb")
    (bb / "backbone.json").write_text('{"format": "gsdistill-backbone/1", "model_na')
    runs = tmp_path / "runs"
    assert main(["detect", "train", *FAST, f"data={data}", f"backbone={bb}", f"project={runs}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{bb / 'backbone.json'}: unreadable JSON file" in err
    (bb / "backbone.json").write_text('{"format": "gsdistill-backbone/1", "kwargs": {}}')
    assert main(["detect", "export", f"backbone={bb}", "--out", str(tmp_path / "x.pt")]) == 2
    assert f"{bb / 'backbone.json'}: no model_name" in capsys.readouterr().err
    assert main(["detect", "train", *FAST, f"data={data}", f"project={runs}",
                 "random_backbone.name=vit_tinny_patch16_224"]) == 2
    assert "did you mean 'vit_tiny_patch16_224'" in capsys.readouterr().err
    assert not runs.exists()


def test_a_run_that_fails_before_its_first_checkpoint_is_removed(data, tmp_path, capsys):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x80\x04 not a checkpoint")
    runs = tmp_path / "runs"
    for _ in range(2):  # every failed try used to leave one more head_only-N folder
        assert main(["detect", "train", *FAST, f"data={data}", f"model={junk}", f"project={runs}"]) == 2
        assert str(junk) in capsys.readouterr().err
    assert not runs.exists() or list(runs.iterdir()) == []


def test_images_that_decoded_are_not_decoded_again(data, monkeypatch):
    from gsdistill.detect import image_check
    check_yolo_dataset(data)
    calls = []
    monkeypatch.setattr(image_check, "image_problem", lambda p: calls.append(p))
    check_yolo_dataset(data)
    assert calls == []  # every image remembered by size and modification time
    bad = _truncate(data, "val")
    check_yolo_dataset(data)
    assert calls == [bad]  # the changed file only
