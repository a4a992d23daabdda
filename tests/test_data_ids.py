"""Page ids are unique by construction (relative paths), a repeated id never aborts a build, and
skip summaries keep the whole reason kind."""
from __future__ import annotations

import numpy as np
from PIL import Image

from gsdistill.config import load_config
from gsdistill.tuples.builder import inputs as build_inputs
from gsdistill.tuples.builder.driver import build_shards
from gsdistill.tuples.errors import SkipLog, reason_key
from gsdistill.tuples.store.writer import sample_key
from gsdistill.tuples.store.reader import read_manifest, read_pages
from gsdistill.tuples.store.writer import write_shards
from test_data_bad_input import fake_ocr, text_pdf


def cfg(*overrides):
    return load_config("tuples", None, ["build.progress=false", *overrides])


def test_pdfs_with_colliding_stems_all_become_pages(tmp_path):
    src = tmp_path / "pdfs"
    (src / "report").mkdir(parents=True)
    text_pdf(src / "report" / "v1.pdf")
    text_pdf(src / "report_v1.pdf", pages=2)
    text_pdf(src / "report_v1.PDF")
    manifest = build_shards("pdf", src, tmp_path / "out", cfg())
    ids = sorted(p["id"] for p in read_pages(tmp_path / "out"))
    assert ids == ["report/v1.pdf-p0001", "report_v1.PDF-p0001", "report_v1.pdf-p0001", "report_v1.pdf-p0002"]
    assert manifest["skipped_count"] == 0 and not list((tmp_path / "out").glob("*.tmp"))


def test_images_with_the_same_stem_all_become_pages(tmp_path, monkeypatch):
    monkeypatch.setattr(build_inputs, "ocr_function", lambda c: fake_ocr)
    src = tmp_path / "scans"
    src.mkdir()
    ramp = (np.tile(np.linspace(0, 1, 64), (48, 1)) * 255).astype(np.uint8)
    Image.fromarray(ramp, "L").save(src / "scan.jpg")
    Image.fromarray(ramp, "L").save(src / "scan.png")
    build_shards("images", src, tmp_path / "out", cfg())
    assert sorted(p["id"] for p in read_pages(tmp_path / "out")) == ["scan.jpg", "scan.png"]


def test_sample_key_is_injective_and_webdataset_safe():
    ids = ["report/v1.pdf-p0001", "report_v1.pdf-p0001", "report.v1.pdf-p0001", "réport v1", "r_2fv1"]
    keys = [sample_key(i) for i in ids]
    assert len(set(keys)) == len(ids)
    assert all(set(k) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") for k in keys)
    assert keys[0] == "report_2fv1_2epdf-p0001" and keys[3] == "r_c3_a9port_20v1"


def test_a_repeated_id_is_recorded_and_the_build_goes_on(tmp_path):
    def page(pid, shade):
        return {"id": pid, "image": Image.new("RGB", (20, 20), (shade, 0, 0)), "width": 20, "height": 20,
                "spans": [{"text": pid, "bbox": [0, 0, 20, 20], "category": "Text"}], "boxes": [], "doc_id": "d"}
    manifest = write_shards([page("a", 1), page("b", 2), page("a", 3), page("c", 4)], tmp_path, pages_per_shard=2,
                            progress=False)
    assert [p["id"] for p in read_pages(tmp_path)] == ["a", "b", "c"]
    assert manifest["skip_reasons"] == {"duplicate page id": 1}
    assert read_manifest(tmp_path)["pages"] == 3 and not list(tmp_path.glob("*.tmp"))


def test_an_iterator_failing_half_way_leaves_no_tmp_shard(tmp_path):
    def pages():
        yield {"id": "a", "image": Image.new("RGB", (8, 8)), "width": 8, "height": 8,
               "spans": [{"text": "a", "bbox": [0, 0, 8, 8], "category": None}], "boxes": []}
        raise RuntimeError("builder crashed")
    try:
        write_shards(pages(), tmp_path, progress=False)
    except RuntimeError:
        pass
    assert [p.name for p in tmp_path.iterdir()] == ["shard-000000.tar"]


def test_skip_summary_key_is_not_cut_inside_brackets():
    log = SkipLog()
    log.add("x.pdf", "unreadable PDF (EmptyFileError: Cannot open empty file: filename='x.pdf'.)")
    log.add("y.pdf", "no text: page has no text layer (a scan? set pdf.ocr_empty_pages=true to OCR it)")
    log.add("z.pdf", "huge page: 9000x9000 pt > max_page_side_pt 5000")
    assert dict(log.reasons()) == {"unreadable PDF": 1, "no text": 1, "huge page": 1}
    assert reason_key("box clipped to page: [1, 2, 3, 4]") == "box clipped to page"
