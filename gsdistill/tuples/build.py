"""Folder drivers: an input (file or folder) of one kind -> page tuples -> shards + manifest.

Every input file ends up as pages or as a recorded skip with its reason: files of another type
("unsupported file type"), files a builder rejects (``DataError``: corrupt, encrypted, empty, ...)
and files a library fails on unexpectedly ("failed: <error>") are all written to the manifest's
``skipped`` list and to ``skipped.csv`` beside it; the other files' pages are kept.
"""
from __future__ import annotations

import csv
import itertools
from pathlib import Path
from typing import Callable, Iterable, Iterator

from omegaconf import DictConfig

from gsdistill.tuples.errors import DataError, SkipLog

KINDS = ("pdf", "images", "coco", "docbank", "synthetic")


def input_files(root: Path, suffixes: set[str], skips: SkipLog, limit: int | None = None) -> list[Path]:
    """Files under ``root`` with one of ``suffixes`` (sorted); every other file is a recorded skip."""
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    else:
        raise DataError(f"{root}: no such file or folder")
    keep = []
    for f in files:
        if f.suffix.lower() in suffixes:
            keep.append(f)
        else:
            skips.add(str(f), f"unsupported file type: {f.suffix or 'no suffix'}")
    return keep[:limit] if limit is not None else keep


def per_file(files: Iterable[Path], make: Callable[[Path], Iterator[dict]], skips: SkipLog) -> Iterator[dict]:
    """Pages of every file; a file that fails is recorded (its pages already yielded stay)."""
    for f in files:
        try:
            yield from make(f)
        except DataError as e:
            skips.add(str(f), str(e).replace(f"{f}: ", "", 1))
        except Exception as e:  # a library failing on odd input: recorded, the other files go on
            skips.add(str(f), f"failed: {type(e).__name__}: {e}")


def ocr_function(cfg: DictConfig):
    from gsdistill.tuples.images import make_tesseract
    o = cfg.ocr
    return make_tesseract(o.lang, int(o.psm), float(o.min_conf), int(o.min_width)) if o.enabled else None


def _doc_id(root: Path, f: Path) -> str:
    """The file's path relative to the input root, suffix included: unique by construction
    (``report/v1.pdf`` and ``report_v1.pdf``, ``scan.jpg`` and ``scan.png`` stay apart)."""
    return (f.relative_to(root) if root.is_dir() else Path(f.name)).as_posix()


def build_pages(kind: str, source: str | Path, cfg: DictConfig, skips: SkipLog) -> tuple[Iterator[dict], int | None]:
    """(page iterator, page count when known in advance) for ``kind`` over ``source``."""
    limit = cfg.build.limit
    if kind == "synthetic":
        from gsdistill.tuples.synthetic import generate_pages
        try:
            n = int(str(source))
        except ValueError:
            raise DataError(f"--from synthetic takes the number of pages as INPUT, got {source!r}") from None
        s = cfg.synthetic
        return generate_pages(n, seed=int(s.seed), width=int(s.width), height=int(s.height),
                              pages_per_doc=int(s.pages_per_doc)), n
    root = Path(source)
    if kind == "pdf":
        from gsdistill.tuples.pdf import pdf_pages
        p = cfg.pdf
        ocr = ocr_function(cfg) if p.ocr_empty_pages else None
        files = input_files(root, {".pdf"}, skips, limit)
        return per_file(files, lambda f: pdf_pages(
            f, dpi=int(p.dpi), skips=skips, max_page_count=int(p.max_page_count),
            max_page_side_pt=float(p.max_page_side_pt), max_pixels=int(p.max_pixels), ocr_fn=ocr,
            doc_id=_doc_id(root, f)), skips), None
    if kind == "images":
        from gsdistill.tuples.images import IMAGE_SUFFIXES, image_pages
        ocr = ocr_function(cfg)
        if ocr is None:
            raise DataError("--from images needs OCR for its text; ocr.enabled is false")
        files = input_files(root, IMAGE_SUFFIXES, skips, limit)
        return per_file(files, lambda f: image_pages(f, skips=skips, ocr_fn=ocr, doc_id=_doc_id(root, f),
                                                    max_pixels=int(cfg.images.max_pixels)), skips), len(files)
    if kind == "coco":
        from gsdistill.tuples.coco import coco_pages
        c = cfg.coco
        files = [root] if root.is_file() else sorted([*root.glob("*.json"), *root.glob("COCO/*.json")])
        if not files:
            raise DataError(f"{root}: no COCO json (looked for *.json and COCO/*.json)")
        return per_file(files[:limit] if limit else files, lambda f: coco_pages(
            f, images_dir=c.images_dir, text_dir=c.text_dir, source=c.source, ocr_fn=ocr_function(cfg),
            skips=skips, max_pixels=int(cfg.images.max_pixels)), skips), None
    if kind == "docbank":
        from gsdistill.tuples.docbank import docbank_pages
        if not root.exists():
            raise DataError(f"{root}: no such file or folder")
        return per_file([root], lambda f: docbank_pages(f, skips=skips, images_dir=cfg.docbank.images_dir,
                                                       max_pixels=int(cfg.images.max_pixels)), skips), None
    raise DataError(f"unknown builder {kind!r}; choose one of {', '.join(KINDS)}")


def write_skips_csv(manifest: dict, out_dir: Path) -> Path:
    path = out_dir / "skipped.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["source", "reason"])
        for item in manifest["skipped"]:
            w.writerow([item["source"], item["reason"]])
    return path


def build_shards(kind: str, source: str | Path, out_dir: str | Path, cfg: DictConfig) -> dict:
    """Build ``kind`` pages from ``source`` into shards in ``out_dir``; return the manifest."""
    from gsdistill.tuples.shards import write_shards
    skips = SkipLog()
    pages, total = build_pages(kind, source, cfg, skips)
    if cfg.build.max_pages is not None:
        pages = itertools.islice(pages, int(cfg.build.max_pages))
        total = min(total, int(cfg.build.max_pages)) if total is not None else int(cfg.build.max_pages)
    b = cfg.build
    manifest = write_shards(pages, out_dir, pages_per_shard=int(b.pages_per_shard), image_format=b.image_format,
                            jpeg_quality=int(b.jpeg_quality), skips=skips, progress=bool(b.progress), total=total)
    write_skips_csv(manifest, Path(out_dir))
    return manifest
