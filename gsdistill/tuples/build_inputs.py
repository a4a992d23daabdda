"""Reading a build's inputs: the input files of a folder (others recorded as skips), the pages of
each file with its failures recorded, document ids, the OCR function of a config."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Iterator

from omegaconf import DictConfig

from gsdistill.tuples.errors import DataError, SkipLog

KINDS = ("pdf", "images", "coco", "docbank", "synthetic")


def input_files(root: Path, suffixes: set[str], skips: SkipLog, limit: int | None = None,
                exclude: Path | None = None) -> list[Path]:
    """Files under ``root`` with one of ``suffixes`` (sorted); every other file is a recorded skip.
    Hidden files and the folder ``exclude`` (the build's output, when it lies inside ``root``: its
    shards must not become inputs of the next run) are left out."""
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
                       and not (exclude is not None and Path(exclude) in p.parents))
    else:
        raise DataError(f"{root}: no such file or folder")
    if not files:
        raise DataError(f"{root}: empty folder, no input files in it")
    keep = []
    for f in files:
        if f.suffix.lower() in suffixes:
            keep.append(f)
        else:
            skips.add(str(f), f"unsupported file type: {f.suffix or 'no suffix'}")
    return keep[:limit] if limit is not None else keep


def per_file(files: Iterable, make: Callable[..., Iterator[dict]], skips: SkipLog,
             name: Callable[..., str] = str) -> Iterator[dict]:
    """Pages of every file; a file that fails is recorded under ``name(file)`` (its pages already
    yielded stay)."""
    for f in files:
        try:
            yield from make(f)
        except DataError as e:
            skips.add(name(f), str(e).replace(f"{name(f)}: ", "", 1))
        except Exception as e:  # a library failing on odd input: recorded, the other files go on
            skips.add(name(f), f"failed: {type(e).__name__}: {e}")


def ocr_function(cfg: DictConfig):
    from gsdistill.tuples.images import make_tesseract
    o = cfg.ocr
    return make_tesseract(o.lang, int(o.psm), float(o.min_conf), int(o.min_width)) if o.enabled else None


def _doc_id(root: Path, f: Path) -> str:
    """The file's path relative to the input root, suffix included: unique by construction
    (``report/v1.pdf`` and ``report_v1.pdf``, ``scan.jpg`` and ``scan.png`` stay apart)."""
    return (f.relative_to(root) if root.is_dir() else Path(f.name)).as_posix()
