"""The demo on a user's own PDFs: build tuples from a folder, then split by document.

Broken files and pages without text are recorded in the build manifest (and in the report), never
fatal. At most ``pages_per_pdf`` pages are taken from each PDF, so a large folder contributes many
documents rather than the first few long ones.

``detect_extra_pdfs`` (a second folder) adds labelled pages that train the detection heads only: more
documents for the head to generalise from, never pretrained on and never held out. A file of it that
is byte-identical to one of ``--pdfs`` is a recorded skip (it could be a held-out document).
"""
from __future__ import annotations

import itertools
import math
from pathlib import Path

from gsdistill.config import load_config
from gsdistill.tuples.builder.driver import write_skips_csv
from gsdistill.tuples.builder.inputs import _doc_id, file_sha256, input_files, per_file
from gsdistill.tuples.errors import DataError, SkipLog
from gsdistill.tuples.store.reader import read_manifest
from gsdistill.tuples.store.writer import write_shards
from gsdistill.eval.splits import split_shards

EXTRA_PREFIX = "detect-extra/"  # doc ids of the extra pages: never equal to a document of --pdfs


def _summary(m: dict) -> dict:
    return {k: m[k] for k in ("pages", "documents", "spans", "boxes_per_class", "skipped_count", "skip_reasons")}


def _pdf_page_stream(files: list[Path], root: Path, dpi: int, pages_per_pdf: int, skips: SkipLog, prefix: str = ""):
    from gsdistill.tuples.sources.pdf import pdf_pages  # here: the demo's detect stage imports this module on GPU
                                                         #   machines, which have no PDF reader (pymupdf)
    p = load_config("tuples", None, [f"pdf.dpi={dpi}"]).pdf
    return per_file(files, lambda f: pdf_pages(
        f, dpi=dpi, skips=skips, max_page_count=int(p.max_page_count), max_page_side_pt=float(p.max_page_side_pt),
        max_pixels=int(p.max_pixels), max_pages=pages_per_pdf, doc_id=prefix + _doc_id(root, f)), skips)


def build_pdf_split(pdfs: Path, data_dir: Path, dpi: int, max_pages: int, pages_per_pdf: int,
                    eval_fraction: float, seed: int) -> dict:
    """``data_dir/all`` (every page), ``data_dir/train`` and ``data_dir/eval`` (disjoint documents)."""
    skips = SkipLog()
    files = input_files(Path(pdfs), {".pdf"}, skips)
    if not files:
        raise DataError(f"{pdfs}: no PDF files found")
    pages = _pdf_page_stream(files, Path(pdfs), dpi, pages_per_pdf, skips)
    all_dir = data_dir / "all"
    manifest = write_shards(itertools.islice(pages, max_pages), all_dir, skips=skips)
    write_skips_csv(manifest, all_dir)
    if manifest["documents"] < 2:
        raise DataError(f"{pdfs}: only {manifest['documents']} usable document(s); the held-out split needs two or more")
    split_shards(all_dir, data_dir / "train", data_dir / "eval", eval_fraction=eval_fraction, seed=seed)
    return {"all PDF pages": _summary(manifest), "train": _summary(read_manifest(data_dir / "train")),
            "eval": _summary(read_manifest(data_dir / "eval"))}


def build_detect_extra(extra: Path, out_dir: Path, dpi: int, max_pages: int, pages_per_pdf: int,
                       pdfs: Path | None = None) -> dict:
    """Shards of the pages of the PDFs under ``extra`` in ``out_dir`` (doc ids ``detect-extra/<path>``), for the
    detection heads alone; a file with the bytes of one under ``pdfs`` is skipped with that reason."""
    skips = SkipLog()
    files = input_files(Path(extra), {".pdf"}, skips)
    if not files:
        raise DataError(f"detect_extra_pdfs {extra}: no PDF files found")
    taken = {}
    if pdfs is not None and Path(pdfs).exists():
        taken = {file_sha256(f): f for f in input_files(Path(pdfs), {".pdf"}, SkipLog())}
    keep = []
    for f in files:
        same = taken.get(file_sha256(f))
        if same is not None:
            skips.add(str(f), f"the same file as {same} of --pdfs (it may be held out): not trained on")
        else:
            keep.append(f)
    pages = _pdf_page_stream(keep, Path(extra), dpi, pages_per_pdf, skips, prefix=EXTRA_PREFIX)
    manifest = write_shards(itertools.islice(pages, max_pages), out_dir, skips=skips)
    write_skips_csv(manifest, out_dir)
    if manifest["pages"] == 0:
        raise DataError(f"detect_extra_pdfs {extra}: no usable page (skips in {out_dir / 'skipped.csv'})")
    return _summary(manifest)


def same_steps_overrides(dcfg, base_pages: int, all_pages: int) -> list[str]:
    """``epochs`` and ``warmup_epochs`` overrides that keep the optimizer steps (and the warm-up's steps) that
    ``dcfg`` gives on ``base_pages`` when the heads train on ``all_pages``: more documents, the same budget."""
    from gsdistill.detect.subset import epochs_for_steps

    batch = int(dcfg.batch)
    base_nb, all_nb = math.ceil(base_pages / batch), math.ceil(all_pages / batch)
    epochs = epochs_for_steps(int(dcfg.epochs), base_pages, all_pages, batch)
    return [f"epochs={epochs}", f"warmup_epochs={float(dcfg.warmup_epochs) * base_nb / all_nb:.4g}"]
