"""Where ``detect predict`` writes: one ``<name>.json`` + ``<name>.png`` per page, every name unique and
the same for the same source, and a ``predict.out`` never mixed with predictions of other data.

**Names.** A page of an image is named by the image's path below the source folder, without its
suffix (``scans/a.png`` -> ``scans/a``); a PDF's pages add ``_p<index>`` (``doc.pdf`` ->
``doc_p0000``). Files whose names would meet keep their suffix in the name: ``a.png`` and ``a.jpg``
of one folder become ``a_png`` and ``a_jpg``, and so does an image ``x_p0000.png`` beside ``x.pdf``.
So same-named pages of two sub-folders never overwrite one another.

**Earlier predictions.** Every page JSON records the ``source`` and ``weights`` it was predicted
from, which is how a later run recognises it. Predicting the same source with the same weights
again replaces that run's pages (said on stderr: a page gone from the source goes from the folder).
Predictions of another source or other weights are refused unless ``overwrite``, which removes them
first (those page JSONs and their drawn PNGs only, and only where gsdistill wrote them: the folder's
record). A file that is no prediction where a page would be written is refused, ``overwrite`` or
not. A folder holding no prediction but files gsdistill did not write is refused unless
``overwrite``; other files in the folder are never touched. ``predict.out`` never holds the source
or the weights.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

from gsdistill.detect.yolo_folder import IMAGE_SUFFIXES
from gsdistill.output_folder import OutputConflict
from gsdistill.output_manifest import EVERYTHING
from gsdistill.output_removal import describe, inventory, remove_written

RECORD_KEYS = {"page", "source", "weights", "boxes"}  # what makes a .json a page prediction of this command


class PlannedPage(NamedTuple):
    file: Path
    index: int | None  # the page of a PDF; None for an image
    name: str  # relative to predict.out, without .json / .png


def source_files(source: Path) -> list[Path]:
    """The PDFs and images of ``source`` (a file, or a folder searched recursively), sorted."""
    if not source.exists():
        raise FileNotFoundError(f"predict: {source} does not exist")
    if not source.is_dir():
        return [source]
    files = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES + (".pdf",))
    if not files:
        raise ValueError(f"predict: {source} holds no PDF or image files ({', '.join(IMAGE_SUFFIXES)}, .pdf)")
    return files


def _pdf_pages(path: Path) -> int:
    import pymupdf as fitz

    try:
        with fitz.open(path) as doc:
            return doc.page_count
    except (fitz.FileDataError, RuntimeError) as e:
        raise ValueError(f"predict: {path} is not a readable PDF ({e})") from None


def plan_pages(source: Path) -> list[PlannedPage]:
    """Every page of ``source`` with its output name (see the module docstring), checked unique."""
    files = source_files(source)
    base = {f: (f.relative_to(source) if source.is_dir() else Path(f.name)).with_suffix("").as_posix() for f in files}
    pdfs = {base[f].casefold() for f in files if f.suffix.lower() == ".pdf"}
    seen: dict[str, int] = {}
    for f in files:
        seen[base[f].casefold()] = seen.get(base[f].casefold(), 0) + 1

    def clashes(f: Path) -> bool:  # another file of the source would give (some of) the same names
        key = base[f].casefold()
        page_of_pdf = re.fullmatch(r"(.*)_p\d{4,}", key)
        return seen[key] > 1 or (f.suffix.lower() != ".pdf" and page_of_pdf is not None and page_of_pdf[1] in pdfs)

    planned = []
    for f in files:
        name = f"{base[f]}_{f.suffix.lstrip('.')}" if clashes(f) else base[f]
        if f.suffix.lower() == ".pdf":
            planned += [PlannedPage(f, i, f"{name}_p{i:04d}") for i in range(_pdf_pages(f))]
        elif f.suffix.lower() in IMAGE_SUFFIXES:
            planned.append(PlannedPage(f, None, name))
        else:
            raise ValueError(f"predict: {f} is neither a PDF nor an image ({', '.join(IMAGE_SUFFIXES)})")
    taken: dict[str, Path] = {}
    for page in planned:  # what the suffix rule cannot part (scan_png.jpg beside scan.png and scan.jpg)
        other = taken.setdefault(page.name.casefold(), page.file)
        if other != page.file:
            raise OutputConflict(f"predict: {other} and {page.file} would both be written as {page.name}.json; "
                                 "rename one of them")
    return planned


def earlier_predictions(out: Path, source: Path) -> dict[Path, dict]:
    """The page JSONs ``detect predict`` wrote into ``out`` (path -> record); the source's own files
    (when ``out`` holds the source folder) are not looked at."""
    found = {}
    for path in sorted(out.rglob("*.json")) if out.is_dir() else ():
        if source.is_dir() and source.resolve() in path.resolve().parents:
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and RECORD_KEYS <= set(record):
            found[path] = record
    return found


def clear_earlier(out: Path, source: Path, weights: Path, pages: list[PlannedPage], overwrite: bool) -> None:
    """Make ``out`` ready for this run's ``pages`` (see the module docstring), or refuse it. Earlier
    predictions count only where gsdistill wrote them (the folder's record,
    :mod:`gsdistill.output_manifest`); a folder holding no prediction of gsdistill's but files it did
    not write is refused unless ``overwrite`` (they stay as they are)."""
    this = (str(source.resolve()), str(weights.resolve()))
    inv = inventory(out, EVERYTHING)
    rel = lambda p: p.relative_to(out).as_posix()  # noqa: E731
    earlier = {p: r for p, r in earlier_predictions(out, source).items() if rel(p) in inv.ours}
    other = [r for r in earlier.values() if (str(r["source"]), str(r["weights"])) != this]
    if other and not overwrite:
        raise OutputConflict(f"predict.out {out}: holds {len(other)} predictions of {other[0]['source']} with "
                             f"{other[0]['weights']}; give another predict.out, or --overwrite to replace them "
                             "(removes only the page .json/.png files detect predict wrote)")
    ours = set(earlier) | {p.with_suffix(".png") for p in earlier if rel(p.with_suffix(".png")) in inv.ours}
    for page in pages:
        for path in (out / f"{page.name}.json", out / f"{page.name}.png"):
            if (path.exists() or path.is_symlink()) and path not in ours:
                raise OutputConflict(f"predict.out {out}: {path} is not a prediction of detect predict and would be "
                                     "written over; give another predict.out or move that file")
    if not earlier and inv.foreign and not overwrite:
        raise OutputConflict(f"predict.out {out}: holds files gsdistill did not write ({describe(inv.foreign)}); "
                             "give a new or empty folder, or pass --overwrite to write there anyway (they stay "
                             "as they are)")
    if earlier:
        print(f"[detect] predict.out {out}: replacing {len(earlier)} earlier predictions"
              + (f" (of {len(other)} pages of other data)" if other else ""), file=sys.stderr, flush=True)
    remove_written(out, EVERYTHING, [rel(p) for p in sorted(ours)])
    for folder in sorted({p.parent for p in earlier}, key=lambda f: -len(f.parts)):
        while folder != out and folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            remove_written(out, EVERYTHING, [rel(folder)])  # sub-folders it leaves empty (ours only)
            if folder.exists():
                break
            folder = folder.parent
