"""PDF layout heuristics vs DocBank's ground truth: per-class precision / recall / F1 at IoU >= 0.5.

    python tools/bench/bench_layout.py                      # ../shared/data arXiv PDFs + DocBank samples
    python tools/bench/bench_layout.py --iou 0.3 --show     # looser matching, and every region listed

DocBank labelled one page of each arXiv PDF in ``arxiv_pdfs_docbank`` (annotation ``<paper>_<N>.txt``
= PDF page N + 1). Ground truth = DocBank's tokens of one label merged into regions
(``gsdistill.tuples.sources.docbank.group_tokens``) and mapped to DocLayNet classes; predictions =
``gsdistill.tuples.sources.pdf.page_regions`` on that PDF page. Page-header / Page-footer predictions are
not scored (DocBank has no such label). Matching: one-to-one per class, highest IoU first.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pymupdf

from gsdistill.tuples.sources.layout_eval import LayoutScores, docbank_pdf_pairs, docbank_truth
from gsdistill.tuples.sources.pdf import page_regions

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def score(pairs, threshold: float, show: bool = False) -> dict:
    scores = LayoutScores(threshold=threshold)
    for pdf, index, txt in pairs:
        with pymupdf.open(pdf) as doc:
            page = doc[index]
            pred = [(r["category"], r["bbox"]) for r in page_regions(page)]
            truth = docbank_truth(txt, page.rect.width, page.rect.height)
        scores.add_page(truth, pred)
        if show:
            print(f"--- {pdf.name} page {index + 1}")
            for name, regions in (("truth", truth), ("pred", pred)):
                for c, b in sorted(regions, key=lambda r: (r[1][1], r[1][0])):
                    print(f"  {name:<6}{c:<16}{[round(v) for v in b]}")
    return scores.table()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdfs", type=Path, default=SHARED / "arxiv_pdfs_docbank")
    ap.add_argument("--annotations", type=Path, default=SHARED / "docbank_samples" / "annotations")
    ap.add_argument("--iou", type=float, default=0.5)
    ap.add_argument("--show", action="store_true", help="list every truth and predicted region")
    ap.add_argument("--json", type=Path, default=None, help="also write the table as JSON here")
    args = ap.parse_args()
    pairs = docbank_pdf_pairs(args.pdfs, args.annotations)
    if not pairs:
        raise SystemExit(f"no DocBank-annotated page of a PDF in {args.pdfs} (annotations {args.annotations})")
    table = score(pairs, args.iou, args.show)
    print(f"{len(pairs)} pages, IoU >= {args.iou}")
    print(f"{'class':<16}{'truth':>6}{'pred':>6}{'tp':>5}{'P':>7}{'R':>7}{'F1':>7}")
    for name, r in table.items():
        print(f"{name:<16}{r['truth']:>6}{r['pred']:>6}{r['tp']:>5}{r['precision']:>7.2f}{r['recall']:>7.2f}{r['f1']:>7.2f}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
