"""The demo on a user's own PDFs: build tuples from a folder, then split by document.

Broken files and pages without text are recorded in the build manifest (and in the report), never
fatal. At most ``pages_per_pdf`` pages are taken from each PDF, so a large folder contributes many
documents rather than the first few long ones.
"""
from __future__ import annotations

import itertools
from pathlib import Path

from gsdistill.config import load_config
from gsdistill.tuples.build import _doc_id, input_files, per_file, write_skips_csv
from gsdistill.tuples.errors import DataError, SkipLog
from gsdistill.tuples.pdf import pdf_pages
from gsdistill.tuples.shards import read_manifest, write_shards
from gsdistill.eval.splits import split_shards


def _summary(m: dict) -> dict:
    return {k: m[k] for k in ("pages", "documents", "spans", "boxes_per_class", "skipped_count", "skip_reasons")}


def build_pdf_split(pdfs: Path, data_dir: Path, dpi: int, max_pages: int, pages_per_pdf: int,
                    eval_fraction: float, seed: int) -> dict:
    """``data_dir/all`` (every page), ``data_dir/train`` and ``data_dir/eval`` (disjoint documents)."""
    tcfg = load_config("tuples", None, [f"pdf.dpi={dpi}"])
    p = tcfg.pdf
    skips = SkipLog()
    files = input_files(Path(pdfs), {".pdf"}, skips)
    if not files:
        raise DataError(f"{pdfs}: no PDF files found")
    pages = per_file(files, lambda f: pdf_pages(
        f, dpi=dpi, skips=skips, max_page_count=int(p.max_page_count), max_page_side_pt=float(p.max_page_side_pt),
        max_pixels=int(p.max_pixels), max_pages=pages_per_pdf, doc_id=_doc_id(Path(pdfs), f)), skips)
    all_dir = data_dir / "all"
    manifest = write_shards(itertools.islice(pages, max_pages), all_dir, skips=skips)
    write_skips_csv(manifest, all_dir)
    if manifest["documents"] < 2:
        raise DataError(f"{pdfs}: only {manifest['documents']} usable document(s); the held-out split needs two or more")
    split_shards(all_dir, data_dir / "train", data_dir / "eval", eval_fraction=eval_fraction, seed=seed)
    return {"all PDF pages": _summary(manifest), "train": _summary(read_manifest(data_dir / "train")),
            "eval": _summary(read_manifest(data_dir / "eval"))}
