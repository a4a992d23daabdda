"""A parallel build writes exactly what a one-process build writes: same shards byte for byte, same
manifest and skip log, whatever the number of workers; the plan packs pages into shards the same way."""
from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from gsdistill.config import load_config
from gsdistill.tuples.builder.driver import build_shards
from gsdistill.tuples.builder.plan import Piece, make_plan, pack_units
from gsdistill.tuples.sources.pdf import pdf_pages
from gsdistill.tuples.store.reader import read_pages
from test_data_bad_input import text_pdf


def cfg(*overrides):
    return load_config("tuples", None, ["build.progress=false", "synthetic.width=300", "synthetic.height=400",
                                        *overrides])


def output_of(folder: Path) -> dict:
    """Every shard's bytes, the manifest without its creation time, skipped.csv."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.pop("created")
    return {"shards": {p.name: p.read_bytes() for p in sorted(folder.glob("shard-*"))}, "manifest": manifest,
            "skipped.csv": (folder / "skipped.csv").read_text()}


def pdf_folder(root: Path) -> Path:
    """Four documents, one of 7 pages with a blank one, a damaged file and a file of another type."""
    src = root / "pdfs"
    (src / "sub").mkdir(parents=True)
    text_pdf(src / "long.pdf", pages=7, blank=(3,))
    text_pdf(src / "sub" / "two.pdf", pages=2)
    text_pdf(src / "one.pdf")
    text_pdf(src / "three.pdf", pages=3)
    (src / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n")
    (src / "notes.txt").write_text("not a page")
    return src


def test_pdf_build_is_identical_for_one_and_two_workers(tmp_path):
    src = pdf_folder(tmp_path)
    m1 = build_shards("pdf", src, tmp_path / "n1", cfg("build.workers=1", "build.pages_per_shard=3"))
    m2 = build_shards("pdf", src, tmp_path / "n2", cfg("build.workers=2", "build.pages_per_shard=3"))
    assert output_of(tmp_path / "n1") == output_of(tmp_path / "n2")
    # 13 planned pages -> 5 units of 3, 3, 3, 3, 1; long.pdf's blank 4th page leaves its shard one short
    assert [s["pages"] for s in m1["shards"]] == [3, 2, 3, 3, 1] and m1["pages"] == 12 == m2["pages"]
    # the same pages in the same order as one pass of the PDF builder over the sorted files
    straight = [p["id"] for f in ("long.pdf", "one.pdf", "sub/two.pdf", "three.pdf")
                for p in pdf_pages(src / f, doc_id=f)]
    assert [p["id"] for p in read_pages(tmp_path / "n2")] == straight
    reasons = {s["source"].split("/")[-1]: s["reason"] for s in m2["skipped"]}
    assert set(reasons) == {"broken.pdf", "notes.txt", "long.pdf#page=4"}


def test_synthetic_build_is_identical_for_any_worker_count(tmp_path):
    outputs = []
    for workers in (1, 2, 3):
        build_shards("synthetic", "23", tmp_path / f"n{workers}", cfg(f"build.workers={workers}", "build.pages_per_shard=5"))
        outputs.append(output_of(tmp_path / f"n{workers}"))
    assert outputs[0] == outputs[1] == outputs[2]
    assert list(outputs[0]["shards"]) == [f"shard-{u:06d}.tar" for u in range(5)]
    assert outputs[0]["manifest"]["pages"] == 23


def test_pack_units_splits_long_documents_and_cuts_at_max_pages():
    pieces = [Piece("a", "a", 0, 5), Piece("b", "b", 0, 1, splittable=False), Piece("c", "c", 0, 4, splittable=False),
              Piece("d", "d", 0, 2)]
    units = pack_units(pieces, 3)
    assert [[(p.file, p.first, p.count) for p in u] for u in units] == [
        [("a", 0, 3)], [("a", 3, 2), ("b", 0, 1)], [("c", 0, 4)], [("d", 0, 2)]]
    cut = pack_units(pieces, 3, max_pages=4)
    assert [[(p.file, p.first, p.count) for p in u] for u in cut] == [[("a", 0, 3)], [("a", 3, 1)]]


def test_duplicate_ids_from_two_inputs_are_written_once(tmp_path):
    """Two DocBank token files with one stem in different folders give one page id: the later unit's
    copy is dropped from its shard and recorded, also when each page is a unit of its own."""
    line = "Hello\t100\t100\t200\t120\t0\t0\t0\tCMR10\tparagraph\r\n"
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "paper_0.txt").write_text(line)
    (tmp_path / "b" / "other_0.txt").write_text(line)
    for stem in ("paper_0", "other_0"):
        Image.new("RGB", (100, 130), "white").save(tmp_path / "a" / f"{stem}_ori.jpg")
    manifest = build_shards("docbank", tmp_path, tmp_path / "out", cfg("build.pages_per_shard=1", "build.workers=2"))
    assert [p["id"] for p in read_pages(tmp_path / "out")] == ["docbank-paper_0", "docbank-other_0"]
    assert manifest["pages"] == 2 and manifest["skip_reasons"] == {"duplicate page id": 1}
    assert [s["name"] for s in manifest["shards"]] == ["shard-000000.tar", "shard-000001.tar"]
    assert not (tmp_path / "out" / "shard-000002.tar").exists()


def test_pdf_page_counts_in_a_pool_give_the_same_plan(tmp_path):
    """Planning counts pages of many PDFs in a process pool: same plan, same refusals, as one process."""
    src = tmp_path / "many"
    src.mkdir()
    for i in range(70):
        text_pdf(src / f"doc{i:02d}.pdf", pages=1 + i % 3)
    (src / "doc99.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n")
    one, two = (make_plan("pdf", src, cfg(f"build.workers={w}", "build.pages_per_shard=16")) for w in (1, 2))
    assert one == two and sum(p["count"] for u in one["units"] for p in u) == sum(1 + i % 3 for i in range(70))
    assert [s["source"].split("/")[-1] for s in one["skipped"]] == ["doc99.pdf"]
