"""Reading a build's inputs: the input files of a folder (others recorded as skips), the pages of
each file with its failures recorded, document ids, the OCR function of a config."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Iterator

from omegaconf import DictConfig

from gsdistill.tuples.errors import DataError, SkipLog
from gsdistill.tuples.store.writer import file_sha256  # noqa: F401 (also public here)

KINDS = ("pdf", "images", "coco", "docbank", "synthetic")


def _walk(root: Path, skips: SkipLog, exclude: Path | None) -> list[Path]:
    """Every non-hidden path under ``root`` that is not a folder (files, dangling links, ...),
    following symlinked folders; a folder reached a second time (a symlink loop: a link to a folder
    above it, or a second link to one folder) is a recorded skip, so each is read once."""
    found, seen = [], {os.path.realpath(root)}
    unreadable = lambda e: skips.add(str(e.filename), f"unreadable folder: {e.strerror}")  # noqa: E731
    for folder, subfolders, names in os.walk(root, onerror=unreadable, followlinks=True):
        keep = []
        for name in sorted(subfolders):
            path = Path(folder) / name
            if name.startswith(".") or (exclude is not None and path == Path(exclude)):
                continue  # hidden folders and the build's own output are no inputs
            real = os.path.realpath(path)
            if exclude is not None and real == os.path.realpath(exclude):
                continue
            if real in seen:
                skips.add(str(path), f"folder already read: it leads to {real} (a symlink loop, or a second "
                                     "link to one folder); read once")
                continue
            seen.add(real)
            keep.append(name)
        subfolders[:] = keep
        found += [Path(folder) / n for n in names if not n.startswith(".")]
    return sorted(found)


def input_files(root: Path, suffixes: set[str], skips: SkipLog, limit: int | None = None,
                exclude: Path | None = None) -> list[Path]:
    """Files under ``root`` with one of ``suffixes`` (sorted), symlinked folders followed; every
    other file, a dangling link and anything that is not a regular file is a recorded skip. Hidden
    files and the folder ``exclude`` (the build's output, when it lies inside ``root``: its shards
    must not become inputs of the next run) are left out."""
    skipped_before = len(skips)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = _walk(root, skips, exclude)
    else:
        raise DataError(f"{root}: no such file or folder")
    if not files and len(skips) == skipped_before:
        raise DataError(f"{root}: empty folder, no input files in it")
    keep = []
    for f in files:
        if f.is_symlink() and not f.exists():
            skips.add(str(f), f"dangling symlink: its target {os.readlink(f)} does not exist")
        elif not f.is_file():
            skips.add(str(f), "not a regular file")
        elif f.suffix.lower() in suffixes:
            keep.append(f)
        else:
            skips.add(str(f), f"unsupported file type: {f.suffix or 'no suffix'}")
    return keep[:limit] if limit is not None else keep


def token_files(root: Path, skips: SkipLog, exclude: Path | None = None) -> list[Path]:
    """DocBank token files (``*.txt`` but ``labels*``) under ``root``, symlinked folders followed; the
    folder's images and other files are read by name later, never recorded here; a dangling
    ``.txt`` link is a recorded skip."""
    files = []
    for f in _walk(root, skips, exclude):
        if f.suffix == ".txt" and not f.name.startswith("labels"):
            if f.is_file():
                files.append(f)
            else:
                skips.add(str(f), "dangling symlink or not a regular file")
    return files


def same_files(files: list[Path], skips: SkipLog) -> list[Path]:
    """``files`` without the ones whose bytes equal an earlier file's (the same document under two
    names: its pages would be trained on twice, or land on both sides of a held-out split); each is a
    recorded skip "same file: as X". Only files that share their size with another are read (sha256)."""
    from collections import defaultdict

    by_size = defaultdict(list)
    for f in files:
        by_size[f.stat().st_size].append(f)
    first: dict[str, Path] = {}
    dropped = set()
    for f in files:
        if len(by_size[f.stat().st_size]) < 2:
            continue
        digest = file_sha256(f)
        if digest in first:
            skips.add(str(f), f"same file: as {first[digest]} (identical bytes); built once")
            dropped.add(f)
        else:
            first[digest] = f
    return [f for f in files if f not in dropped]


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
    from gsdistill.tuples.sources.images import make_tesseract
    o = cfg.ocr
    return make_tesseract(o.lang, int(o.psm), float(o.min_conf), int(o.min_width)) if o.enabled else None


def _doc_id(root: Path, f: Path) -> str:
    """The file's path relative to the input root, suffix included: unique by construction
    (``report/v1.pdf`` and ``report_v1.pdf``, ``scan.jpg`` and ``scan.png`` stay apart)."""
    return (f.relative_to(root) if root.is_dir() else Path(f.name)).as_posix()
