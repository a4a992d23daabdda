"""Contact sheets of the PDF builder's boxes of some classes, to check its labels by eye.

    python tools/probes/audit_layout_boxes.py /usr/share/doc/texlive-doc --out runs/audit --sample 120 --pages 8
    python tools/probes/audit_layout_boxes.py my_pdfs/ --classes Table Picture List-item --out runs/audit

Every box of each class on the first ``--pages`` pages of ``--sample`` PDFs (a seeded shuffle of the sorted
paths; all PDFs when the folder holds fewer), cropped from the page and numbered on PNG sheets of 30
(``<class>_<k>.png``), with ``boxes.csv`` listing number, file, page and box (PDF points) for the verdicts.
This is how docs/learning.md ("Labels that mean one thing") counted the tables and pictures among the
builder's Table and Picture boxes. Unreadable PDFs are listed in ``skipped.csv`` with the reason.
"""
from __future__ import annotations

import argparse
import csv
import random
import sys
from pathlib import Path

import pymupdf
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gsdistill.tuples.sources.pdf import page_regions  # noqa: E402

CELL_W, CELL_H, COLS, ROWS = 240, 175, 6, 5


def collect(folder: Path, classes: list[str], sample: int, pages: int, seed: int, skipped: list) -> list[dict]:
    pdfs = sorted(folder.rglob("*.pdf"))
    random.Random(seed).shuffle(pdfs)
    boxes = []
    for path in pdfs[:sample]:
        try:
            doc = pymupdf.open(path)
        except Exception as err:  # a broken file is a recorded skip, not a crash
            skipped.append((str(path), f"cannot open: {err}"))
            continue
        for number in range(min(pages, doc.page_count)):
            page = doc[number]
            for region in page_regions(page):
                if region["category"] in classes:
                    clip = pymupdf.Rect(*region["bbox"]) & page.rect
                    pix = page.get_pixmap(dpi=60, clip=clip)
                    crop = Image.frombytes("RGB", (pix.width, pix.height), pix.samples)
                    crop.thumbnail((CELL_W - 10, CELL_H - 25))
                    boxes.append({"category": region["category"], "file": str(path.relative_to(folder)),
                                  "page": number, "bbox": [round(v, 1) for v in region["bbox"]], "crop": crop})
    return boxes


def write_sheets(boxes: list[dict], classes: list[str], out: Path) -> dict[str, int]:
    counts = {}
    for cat in classes:
        items = [b for b in boxes if b["category"] == cat]
        counts[cat] = len(items)
        per = COLS * ROWS
        for start in range(0, len(items), per):
            sheet = Image.new("RGB", (COLS * CELL_W, ROWS * CELL_H), "white")
            draw = ImageDraw.Draw(sheet)
            for k, b in enumerate(items[start:start + per]):
                x, y = (k % COLS) * CELL_W, (k // COLS) * CELL_H
                sheet.paste(b["crop"], (x, y))
                draw.rectangle([x, y, x + b["crop"].width, y + b["crop"].height], outline="red")
                draw.text((x, y + CELL_H - 20), f"#{start + k} {Path(b['file']).name[:20]} p{b['page']}", fill="black")
            sheet.save(out / f"{cat}_{start // per}.png")
    with open(out / "boxes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["category", "number", "file", "page", "x0", "y0", "x1", "y1"])
        for cat in classes:
            for i, b in enumerate(x for x in boxes if x["category"] == cat):
                w.writerow([cat, i, b["file"], b["page"], *b["bbox"]])
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--classes", nargs="+", default=["Table", "Picture"])
    ap.add_argument("--sample", type=int, default=120, help="PDFs drawn from the folder")
    ap.add_argument("--pages", type=int, default=8, help="first pages of each PDF")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        raise SystemExit(f"audit_layout_boxes: {args.folder} is not a folder of PDFs")
    args.out.mkdir(parents=True, exist_ok=True)
    skipped: list = []
    boxes = collect(args.folder, args.classes, args.sample, args.pages, args.seed, skipped)
    counts = write_sheets(boxes, args.classes, args.out)
    with open(args.out / "skipped.csv", "w", newline="") as f:
        csv.writer(f).writerows([("file", "reason"), *skipped])
    print(", ".join(f"{c}: {n} boxes" for c, n in counts.items()) + f"; {len(skipped)} PDFs skipped; sheets in {args.out}")


if __name__ == "__main__":
    main()
