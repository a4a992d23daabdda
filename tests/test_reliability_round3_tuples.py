"""Issue 55 for ``tuples`` and ``eval``: nothing a user owns is deleted, overwritten or mixed without
their word. Outputs are checked against inputs and each other before a byte is written, a folder
holding another corpus's shards is refused unless --overwrite (which removes only gsdistill's files),
one writer per folder, one line instead of a traceback, and copies of one document are caught."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pymupdf
import pytest
from PIL import Image

from gsdistill.cli import main as gsdistill
from gsdistill.tuples.store.reader import read_manifest, read_pages
from test_reliability_tuples import small_pdf

SMALL = ["build.progress=false", "synthetic.width=200", "synthetic.height=260"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")


def synthetic(out, pages=8, *extra) -> int:
    return gsdistill(["tuples", "build", "--from", "synthetic", str(pages), "--out", str(out), "--workers", "1",
                      *SMALL, *extra])


def split(src, train, held, *extra) -> int:
    return gsdistill(["eval", "split", str(src), "--train-out", str(train), "--eval-out", str(held),
                      "--fraction", "0.5", *extra])


def snapshot(folder) -> dict:
    """Every file under ``folder`` (but the lock) with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".gsdistill.lock"}


def no_traceback(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# ---- 1. eval split: outputs checked against the input and each other before anything is written ----------
def test_split_into_its_own_input_or_one_folder_twice_or_a_file_writes_nothing(tmp_path, capsys):
    assert synthetic(tmp_path / "shards") == 0
    before = snapshot(tmp_path / "shards")
    assert split(tmp_path / "shards", tmp_path / "shards", tmp_path / "held") == 2
    assert snapshot(tmp_path / "shards") == before and not (tmp_path / "held").exists()
    assert split(tmp_path / "shards", tmp_path / "held", tmp_path / "shards") == 2
    assert split(tmp_path / "shards", tmp_path / "shards" / "sub", tmp_path / "held") == 2
    assert snapshot(tmp_path / "shards") == before
    assert split(tmp_path / "shards", tmp_path / "x", tmp_path / "x") == 2
    assert not (tmp_path / "x").exists()
    (tmp_path / "file").write_text("mine")
    assert split(tmp_path / "shards", tmp_path / "file", tmp_path / "y") == 2
    assert (tmp_path / "file").read_text() == "mine" and not (tmp_path / "y").exists()
    no_traceback(capsys)
    assert split(tmp_path / "shards", tmp_path / "train", tmp_path / "held") == 0  # the input is intact
    assert read_manifest(tmp_path / "train")["pages"] + read_manifest(tmp_path / "held")["pages"] == 8


# ---- 2. a folder holding another corpus's shards: refused; --overwrite removes only gsdistill's files -----
def test_build_into_another_builds_folder_is_refused_and_overwrite_keeps_user_files(tmp_path, capsys):
    out = tmp_path / "shards"
    assert synthetic(out, 8) == 0
    from gsdistill.output_folder import lock_folder
    with lock_folder(out):  # an embedding cache, as gsdistill writes it (recorded in the folder's record)
        (out / "embeddings").mkdir()
        (out / "embeddings" / "meta.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    assert synthetic(out, 4) == 2  # another input
    assert snapshot(out) == before
    assert f"{out}" in no_traceback(capsys)
    assert synthetic(out, 8) == 0 and snapshot(out).keys() == before.keys()  # the same build: resumed
    assert read_manifest(out)["pages"] == 8
    assert synthetic(out, 4, "--overwrite") == 0
    assert read_manifest(out)["pages"] == 4 and len(list(read_pages(out, decode_images=False))) == 4
    assert not (out / "embeddings").exists() and (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "units" / "plan.json").read_text())["source"] == "4"


def test_build_into_a_split_folder_and_split_into_a_build_folder_are_refused(tmp_path):
    assert synthetic(tmp_path / "a", 8) == 0 and synthetic(tmp_path / "b", 8, "synthetic.seed=1") == 0
    assert split(tmp_path / "a", tmp_path / "train", tmp_path / "held") == 0
    split_train = snapshot(tmp_path / "train")
    assert synthetic(tmp_path / "train", 8) == 2 and snapshot(tmp_path / "train") == split_train
    built_b = snapshot(tmp_path / "b")
    assert split(tmp_path / "a", tmp_path / "b", tmp_path / "held2") == 2  # b holds a build
    assert snapshot(tmp_path / "b") == built_b and not (tmp_path / "held2").exists()
    assert split(tmp_path / "b", tmp_path / "train", tmp_path / "held") == 2  # a split of another folder
    assert snapshot(tmp_path / "train") == split_train
    assert split(tmp_path / "a", tmp_path / "train", tmp_path / "held") == 0  # the same split, run again
    assert split(tmp_path / "b", tmp_path / "train", tmp_path / "held", "--overwrite") == 0
    assert json.loads((tmp_path / "train" / "split.json").read_text())["source"] == str(tmp_path / "b")


# ---- 3. one writer per folder: the second is refused with the holder's PID -------------------------------
def hold(folder):
    """Another process holding ``folder``'s lock until its stdin closes."""
    code = ("import sys; from gsdistill.output_folder import lock_folder\n"
            f"with lock_folder({str(folder)!r}):\n    print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_every_writer_of_a_held_folder_exits_2_naming_the_holder(tmp_path, capsys):
    assert synthetic(tmp_path / "shards") == 0
    before = snapshot(tmp_path / "shards")
    proc = hold(tmp_path / "shards")
    try:
        assert synthetic(tmp_path / "shards") == 2
        assert str(proc.pid) in no_traceback(capsys)
        assert gsdistill(["tuples", "embed", str(tmp_path / "shards")]) == 2
        assert str(proc.pid) in no_traceback(capsys)
        assert snapshot(tmp_path / "shards") == before and not (tmp_path / "shards" / "embeddings").exists()
        assert synthetic(tmp_path / "src") == 0
        assert split(tmp_path / "src", tmp_path / "t", tmp_path / "shards") == 2
        assert str(proc.pid) in no_traceback(capsys) and not (tmp_path / "t").exists()
        (tmp_path / "run").mkdir()
        assert gsdistill(["eval", "retrieval", "--model", str(tmp_path / "run"), "--pages", str(tmp_path / "src"),
                          "--out", str(tmp_path / "shards")]) == 2
        assert str(proc.pid) in no_traceback(capsys)
    finally:
        proc.stdin.close()
        proc.wait()
    assert snapshot(tmp_path / "shards") == before


def test_two_parallel_builds_into_one_folder(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "gsdistill.cli", "tuples", "build", "--from", "synthetic", "150", "--out", str(out),
           "--workers", "2", "build.pages_per_shard=3", *SMALL]
    first = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (out / "units" / "plan.json").exists() and time.time() < deadline:
        time.sleep(0.01)
    second = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert second.returncode == 2 and f"PID {first.pid}" in second.stderr and "Traceback" not in second.stderr
    assert read_manifest(out)["pages"] == 150 and len(list(read_pages(out, decode_images=False))) == 150


# ---- 4. one line, exit 2, before any work ----------------------------------------------------------------
def test_unusable_encoder_or_output_file_is_one_line_before_any_work(tmp_path, capsys):
    assert synthetic(tmp_path / "shards") == 0
    before = snapshot(tmp_path / "shards")
    (tmp_path / "pdfs").mkdir()
    small_pdf(tmp_path / "pdfs" / "a.pdf", "words")
    for encoder in ("nonexistent-org/x", str(tmp_path / "pdfs"), str(tmp_path / "pdfs" / "a.pdf"), "./no/such"):
        assert gsdistill(["tuples", "embed", str(tmp_path / "shards"), "--encoder", encoder]) == 2
        no_traceback(capsys)
    assert snapshot(tmp_path / "shards") == before
    (tmp_path / "report").write_text("mine")
    (tmp_path / "run").mkdir()
    assert gsdistill(["eval", "retrieval", "--model", str(tmp_path / "run"), "--pages", str(tmp_path / "shards"),
                      "--out", str(tmp_path / "report")]) == 2
    assert gsdistill(["eval", "retrieval", "--model", str(tmp_path / "run"), "--pages", str(tmp_path / "shards"),
                      "--out", str(tmp_path / "run")]) == 2  # its config.yaml would replace the run's
    no_traceback(capsys)
    assert (tmp_path / "report").read_text() == "mine" and not list((tmp_path / "run").iterdir())


# ---- 5. copies of one document, symlinks, tiny pages, bad COCO boxes -------------------------------------
def pdf_build(src, out) -> dict:
    assert gsdistill(["tuples", "build", "--from", "pdf", str(src), "--out", str(out), "--dpi", "36",
                      "--workers", "1", "build.progress=false"]) == 0
    return read_manifest(out)


def test_build_skips_a_second_copy_reads_symlinked_folders_and_records_dangling_links(tmp_path):
    src = tmp_path / "in"
    (src / "real").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    small_pdf(src / "a.pdf", "alpha bravo charlie")
    (src / "real" / "copy.pdf").write_bytes((src / "a.pdf").read_bytes())
    small_pdf(tmp_path / "elsewhere" / "b.pdf", "linked folder words")
    (src / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "loop").symlink_to(tmp_path / "elsewhere")  # a loop, read once
    (src / "gone.pdf").symlink_to(tmp_path / "missing.pdf")
    m = pdf_build(src, tmp_path / "out")
    ids = sorted(p["doc_id"] for p in read_pages(tmp_path / "out", decode_images=False))
    assert ids == ["a.pdf", "linked/b.pdf"]
    skipped = {s["source"]: s["reason"] for s in m["skipped"]}
    assert set(skipped) == {str(src / "real" / "copy.pdf"), str(src / "gone.pdf"), str(src / "linked" / "loop")}
    assert str(src / "a.pdf") in skipped[str(src / "real" / "copy.pdf")]
    csv = (tmp_path / "out" / "skipped.csv").read_text()
    assert str(src / "gone.pdf") in csv and str(src / "real" / "copy.pdf") in csv


def test_a_tiny_page_with_text_is_not_called_a_scan(tmp_path):
    (tmp_path / "in").mkdir()
    doc = pymupdf.open()
    doc.new_page(width=10, height=10).insert_text((0, 5), "a b c d e f g", fontsize=1)
    doc.save(tmp_path / "in" / "tiny.pdf")
    small_pdf(tmp_path / "in" / "ok.pdf", "usable words")
    m = pdf_build(tmp_path / "in", tmp_path / "out")
    assert m["pages"] == 1 and set(m["skip_reasons"]) == {"tiny page"}


@pytest.mark.parametrize("bbox", [[1, 2, 3], None, ["1", "2", "3", "4"], 5])
def test_a_coco_box_that_is_not_four_numbers_is_recorded_with_its_annotation_id(tmp_path, bbox):
    (tmp_path / "images").mkdir()
    Image.new("RGB", (100, 100), "white").save(tmp_path / "images" / "p1.png")
    (tmp_path / "JSON").mkdir()
    (tmp_path / "JSON" / "p1.json").write_text(json.dumps({"cells": [{"bbox": [10, 10, 50, 20], "text": "hello"}]}))
    anns = [{"id": 7, "image_id": 1, "category_id": 1, "bbox": bbox},
            {"id": 8, "image_id": 1, "category_id": 1, "bbox": [5, 5, 60, 30]}]
    (tmp_path / "data.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "p1.png", "width": 90,
                                                                "height": 100}],
                                                    "annotations": anns, "categories": [{"id": 1, "name": "Text"}]}))
    assert gsdistill(["tuples", "build", "--from", "coco", str(tmp_path / "data.json"), "--out", str(tmp_path / "o"),
                      "--workers", "1", "--no-ocr", f"coco.text_dir={tmp_path / 'JSON'}", "build.progress=false"]) == 0
    m = read_manifest(tmp_path / "o")
    assert m["pages"] == 1 and m["boxes_per_class"] == {"Text": 1}  # the good box of the page is kept
    bad = [s for s in m["skipped"] if s["source"].endswith("#ann=7")]
    assert len(bad) == 1 and bad[0]["source"].startswith(str(tmp_path / "data.json"))


def test_split_keeps_documents_with_identical_pages_on_one_side(tmp_path, capsys):
    src = tmp_path / "in"
    src.mkdir()
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima"
    for name, title in (("a.pdf", "one"), ("renamed.pdf", "two")):  # other bytes, the same page
        doc = pymupdf.open()
        doc.new_page(width=200, height=150).insert_text((20, 40), words, fontsize=9)
        doc.set_metadata({"title": title})
        doc.save(src / name)
    for i, w in enumerate(["mike november oscar", "papa quebec romeo", "sierra tango uniform", "victor xray"]):
        small_pdf(src / f"d{i}.pdf", w)
    assert pdf_build(src, tmp_path / "all")["documents"] == 6  # not the same file: the build keeps both
    for seed in range(6):
        assert split(tmp_path / "all", tmp_path / "t", tmp_path / "e", "--seed", str(seed), "--overwrite") == 0
        record = json.loads((tmp_path / "e" / "split.json").read_text())
        assert ("a.pdf" in record["eval_docs"]) == ("renamed.pdf" in record["eval_docs"])
        assert ("a.pdf" in record["train_docs"]) == ("renamed.pdf" in record["train_docs"])
        assert record["grouped"] == [["a.pdf", "renamed.pdf"]]
        assert "a.pdf = renamed.pdf" in no_traceback(capsys)
