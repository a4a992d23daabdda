"""Scoring layout regions against ground truth: per-class precision / recall / F1 at an IoU threshold.

Used by ``tools/bench/bench_layout.py`` (the PDF heuristics against DocBank's labels on the arXiv PDFs
they were made from) and by the tests that guard those numbers. Matching is one-to-one within a
class on one page, highest IoU first (the usual greedy detection matching without scores).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from gsdistill.tuples.sources.docbank import group_tokens, parse_tokens
from gsdistill.tuples.labels import to_doclaynet

# DocLayNet classes DocBank has labels for; predictions of the others (Page-header, Page-footer)
# cannot be judged against it and are left out of the scores.
DOCBANK_SCORED = ("Caption", "Footnote", "Formula", "List-item", "Picture", "Section-header", "Table", "Text", "Title")


def iou(a, b) -> float:
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def match_count(truth: list, pred: list, threshold: float) -> int:
    """True positives: one-to-one pairs with IoU >= ``threshold``, taken highest IoU first."""
    pairs = sorted(((iou(t, p), i, j) for i, t in enumerate(truth) for j, p in enumerate(pred)), reverse=True)
    used_t, used_p, tp = set(), set(), 0
    for value, i, j in pairs:
        if value < threshold:
            break
        if i not in used_t and j not in used_p:
            used_t.add(i)
            used_p.add(j)
            tp += 1
    return tp


class LayoutScores:
    """Accumulates (truth, prediction) regions page by page; ``table()`` gives per-class and overall P/R/F1."""

    def __init__(self, classes=DOCBANK_SCORED, threshold: float = 0.5):
        self.classes, self.threshold = tuple(classes), threshold
        self.tp, self.n_truth, self.n_pred = Counter(), Counter(), Counter()

    def add_page(self, truth: list[tuple[str, list]], pred: list[tuple[str, list]]) -> None:
        for cls in self.classes:
            t = [b for c, b in truth if c == cls]
            p = [b for c, b in pred if c == cls]
            self.n_truth[cls] += len(t)
            self.n_pred[cls] += len(p)
            self.tp[cls] += match_count(t, p, self.threshold)

    @staticmethod
    def _prf(tp: int, n_truth: int, n_pred: int) -> dict:
        p = tp / n_pred if n_pred else 0.0
        r = tp / n_truth if n_truth else 0.0
        return {"truth": n_truth, "pred": n_pred, "tp": tp, "precision": p, "recall": r,
                "f1": 2 * p * r / (p + r) if p + r else 0.0}

    def table(self) -> dict[str, dict]:
        rows = {c: self._prf(self.tp[c], self.n_truth[c], self.n_pred[c]) for c in self.classes
                if self.n_truth[c] or self.n_pred[c]}
        rows["overall"] = self._prf(sum(self.tp.values()), sum(self.n_truth.values()), sum(self.n_pred.values()))
        return rows


def docbank_truth(annotation: Path, page_w: float, page_h: float) -> list[tuple[str, list[float]]]:
    """DocBank's regions of one page (tokens of one label merged by ``docbank.group_tokens``), as
    (DocLayNet class, box in the PDF page's points); DocBank boxes are in 0..1000 of the page."""
    tokens, _, _ = parse_tokens(annotation)
    sx, sy = page_w / 1000.0, page_h / 1000.0
    return [(to_doclaynet(r["label"], "docbank"), [r["bbox"][0] * sx, r["bbox"][1] * sy, r["bbox"][2] * sx,
                                                  r["bbox"][3] * sy]) for r in group_tokens(tokens)]


def docbank_pdf_pairs(pdf_dir: Path, annotations: Path) -> list[tuple[Path, int, Path]]:
    """(pdf, 0-based page index, annotation) for every DocBank page whose ``*_black.pdf`` is present:
    annotation ``<paper>_<N>.txt`` is PDF page N + 1 (1-based), i.e. index N."""
    pairs = []
    for pdf in sorted(pdf_dir.glob("*_black.pdf")):
        paper = pdf.name[: -len("_black.pdf")]
        for txt in sorted(annotations.glob(f"{paper}_*.txt")):
            n = txt.stem[len(paper) + 1:]
            if n.isdigit():
                pairs.append((pdf, int(n), txt))
    return pairs
