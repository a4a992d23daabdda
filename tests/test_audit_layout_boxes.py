"""tools/probes/audit_layout_boxes.py: numbered crops of the builder's Table / Picture boxes, a CSV of them, skips recorded."""
from __future__ import annotations

import csv
import io

import pymupdf
from PIL import Image
from tool_loader import load_tool


def test_audit_sheets_list_every_table_and_picture_box(tmp_path, draw_ruled_table):
    folder = tmp_path / "pdfs"
    folder.mkdir()
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    draw_ruled_table(page)
    buf = io.BytesIO()
    Image.radial_gradient("L").convert("RGB").save(buf, format="PNG")
    page.insert_image(pymupdf.Rect(200, 320, 400, 470), stream=buf.getvalue())
    doc.save(folder / "one.pdf")
    (folder / "broken.pdf").write_bytes(b"not a pdf at all")
    out = tmp_path / "audit"
    load_tool("probes/audit_layout_boxes.py").main([str(folder), "--out", str(out), "--sample", "5", "--pages", "2"])
    rows = list(csv.DictReader(open(out / "boxes.csv")))
    assert [(r["category"], r["file"], r["page"]) for r in rows] == [("Table", "one.pdf", "0"), ("Picture", "one.pdf", "0")]
    assert [float(rows[0][k]) for k in ("x0", "y0", "x1", "y1")] == [150.0, 520.0, 460.0, 592.0]
    assert Image.open(out / "Table_0.png").size == (6 * 240, 5 * 175) and (out / "Picture_0.png").is_file()
    skipped = list(csv.reader(open(out / "skipped.csv")))
    assert len(skipped) == 2 and skipped[1][0].endswith("broken.pdf") and "cannot open" in skipped[1][1]
