"""The DocBank layout bench: its scoring against hand-worked cases, and the PDF heuristics' numbers."""
from __future__ import annotations

import pymupdf
import pytest

from gsdistill.tuples.sources.layout_eval import LayoutScores, docbank_pdf_pairs, docbank_truth, iou, match_count
from gsdistill.tuples.sources.pdf import page_regions


def test_iou_and_one_to_one_matching():
    assert iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert iou([0, 0, 1, 1], [2, 2, 3, 3]) == 0.0
    truth = [[0, 0, 10, 10], [20, 0, 30, 10]]
    # two predictions on the first box: only one counts; the second box is matched at IoU 0.81
    pred = [[0, 0, 10, 10], [0, 0, 10, 9], [21, 1, 30, 10]]
    assert match_count(truth, pred, 0.5) == 2 and match_count(truth, pred, 0.9) == 1


def test_scores_per_class_and_overall():
    s = LayoutScores(classes=("Text", "Table"))
    s.add_page([("Text", [0, 0, 10, 10]), ("Table", [0, 20, 10, 30])],
               [("Text", [0, 0, 10, 10]), ("Text", [50, 50, 60, 60]), ("Table", [0, 40, 10, 50]), ("Picture", [0, 0, 5, 5])])
    t = s.table()
    assert (t["Text"]["precision"], t["Text"]["recall"]) == (0.5, 1.0) and t["Text"]["f1"] == pytest.approx(2 / 3)
    assert (t["Table"]["tp"], t["Table"]["recall"]) == (0, 0.0)
    assert (t["overall"]["tp"], t["overall"]["truth"], t["overall"]["pred"]) == (1, 2, 3)  # Picture is not scored


def test_pdf_heuristics_meet_the_docbank_targets(shared_data):
    pairs = docbank_pdf_pairs(shared_data / "arxiv_pdfs_docbank", shared_data / "docbank_samples" / "annotations")
    assert [(p.name[:6], i) for p, i, _ in pairs] == [("102.ta", 3), ("23.tar", 1), ("246.ta", 3), ("75.tar", 12)]
    scores = LayoutScores(threshold=0.5)
    for pdf, index, txt in pairs:
        with pymupdf.open(pdf) as doc:
            page = doc[index]
            truth = docbank_truth(txt, page.rect.width, page.rect.height)
            scores.add_page(truth, [(r["category"], r["bbox"]) for r in page_regions(page)])
    table = scores.table()
    assert table["overall"]["f1"] >= 0.75, table["overall"]
    low = {c: r["recall"] for c, r in table.items() if c != "overall" and r["truth"] and r["recall"] < 0.5}
    assert not low, low
