"""The build plan: which pages go into which shard, fixed before any page is built.

Documents are taken in sorted order and cut into *pieces* (a PDF page range, one image or DocBank
token file, a run of synthetic pages, a whole COCO json); pieces are packed into *units* of
``pages_per_shard`` planned pages, and unit ``u`` becomes ``shard-{u:06d}.tar``. A long PDF is split
across units, so every shard but the last plans exactly ``pages_per_shard`` pages (pages skipped
while building leave it shorter). The plan depends only on the inputs and the config, never on how
many workers build it, so page ids, shard contents and the manifest are the same for any
``--workers`` and for a resumed build. Planning reads only page counts (~0.3 ms per PDF page).

A COCO json is one piece (its pages cannot be built apart without reading the whole json per
piece): a json of more than ``pages_per_shard`` images is a unit, and a shard, of its own.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gsdistill.tuples.builder.inputs import KINDS, _doc_id, input_files, same_files, token_files
from gsdistill.tuples.errors import DataError, SkipLog

# keys that change how a build runs, not what it writes: a resumed build may change them
RUN_KEYS = {"build": ("progress", "workers", "engine", "ray_address", "max_retries"), "embed": None, "threads": None}


@dataclass(frozen=True)
class Piece:
    """Pages ``first .. first+count-1`` of one input (``file`` None: synthetic pages)."""
    file: str | None
    doc_id: str | None
    first: int
    count: int
    splittable: bool = True
    image: str | None = None  # DocBank: the page image found while planning
    stamp: str | None = None  # the file's size and modification time: an edited input is built again


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}-{st.st_mtime_ns}"


def build_settings(cfg: DictConfig) -> dict:
    """The config keys that decide a build's output (a changed value makes a resume start over)."""
    settings = OmegaConf.to_container(cfg, resolve=True)
    for section, keys in RUN_KEYS.items():
        if keys is None:
            settings.pop(section, None)
        else:
            for k in keys:
                settings.get(section, {}).pop(k, None)
    return settings


LETTER_PT = (612, 792)  # a US-letter page in PDF points: the page size the dpi limit is stated for


def max_dpi(max_pixels: int) -> int:
    """The highest ``pdf.dpi`` at which a US-letter page renders to at most ``max_pixels`` pixels."""
    return int(72 * (max_pixels / (LETTER_PT[0] * LETTER_PT[1])) ** 0.5)


def check_build_config(cfg: DictConfig) -> None:
    """Ranges the comments of ``configs/tuples/default.yaml`` cannot state (an upper bound), checked
    before any input is read: a value that would make every page a recorded skip is refused."""
    from gsdistill.config import ConfigError
    dpi, top = int(cfg.pdf.dpi), max_dpi(int(cfg.pdf.max_pixels))
    if dpi > top:
        raise ConfigError(f"pdf.dpi (--dpi) must be 18..{top}, got {dpi}: at more dpi a US-letter page renders "
                          f"to over pdf.max_pixels={cfg.pdf.max_pixels} pixels and every page would be skipped as "
                          f"'huge page' (raise pdf.max_pixels to render finer)")
    if int(cfg.build.jpeg_quality) > 100:
        raise ConfigError(f"build.jpeg_quality must be 1..100, got {cfg.build.jpeg_quality}")


def _pdf_page_count(path: Path, max_page_count: int) -> tuple[int, str | None]:
    """(pages, None) or (0, why the PDF is refused: the builder's own checks, ``open_pdf``)."""
    from gsdistill.tuples.sources.pdf import open_pdf
    try:
        doc = open_pdf(path, max_page_count)
    except DataError as e:
        return 0, str(e).replace(f"{path}: ", "", 1)
    count = doc.page_count
    doc.close()
    return count, None


def _pdf_page_counts(files: list[Path], max_page_count: int, workers: int | None) -> list[tuple[int, str | None]]:
    """Page counts of ``files`` in order, on this machine's cores (~9 ms a PDF: ~3 minutes for 20K
    PDFs on one core, as long as building them on 64)."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial

    from gsdistill.threads import available_cores
    from gsdistill.tuples.worker_guard import second_interrupt_kills_workers, start_pool_worker
    count = partial(_pdf_page_count, max_page_count=max_page_count)
    workers = min(int(workers) if workers else available_cores(), available_cores())
    if workers <= 1 or len(files) < 64:  # a pool costs more than it saves on a few files
        return [count(f) for f in files]
    with second_interrupt_kills_workers("the page count"), \
            ProcessPoolExecutor(workers, initializer=start_pool_worker, initargs=(os.getpid(),)) as pool:
        return list(pool.map(count, files, chunksize=16))


def _pieces(kind: str, source: str, cfg: DictConfig, skips: SkipLog, exclude: Path | None) -> list[Piece]:
    limit = cfg.build.limit
    if kind == "synthetic":
        try:
            n = int(str(source))
        except ValueError:
            n = 0
        if n < 1:
            raise DataError(f"--from synthetic takes the number of pages (>= 1) as INPUT, got {source!r}")
        return [Piece(None, None, 0, n)]
    root = Path(source)
    if kind == "pdf":
        files = same_files(input_files(root, {".pdf"}, skips, limit, exclude), skips)
        pieces = []
        for f, (count, error) in zip(files, _pdf_page_counts(files, int(cfg.pdf.max_page_count), cfg.build.workers)):
            if error is not None:
                skips.add(str(f), error)
            else:
                pieces.append(Piece(str(f), _doc_id(root, f), 0, count, stamp=_stamp(f)))
        return pieces
    if kind == "images":
        from gsdistill.tuples.sources.images import IMAGE_SUFFIXES
        if not cfg.ocr.enabled:
            raise DataError("--from images needs OCR for its text; ocr.enabled is false")
        return [Piece(str(f), _doc_id(root, f), 0, 1, splittable=False, stamp=_stamp(f))
                for f in same_files(input_files(root, IMAGE_SUFFIXES, skips, limit, exclude), skips)]
    if kind == "coco":
        from gsdistill.tuples.sources.coco import read_coco
        files = [root] if root.is_file() else sorted([*root.glob("*.json"), *root.glob("COCO/*.json")])
        if not files:
            raise DataError(f"{root}: no COCO json (looked for *.json and COCO/*.json)")
        pieces = []
        for f in files[:limit] if limit else files:  # a json's images are found beside it: no dedupe by bytes
            try:
                pieces.append(Piece(str(f), None, 0, len(read_coco(f)["images"]), splittable=False, stamp=_stamp(f)))
            except DataError as e:
                skips.add(str(f), str(e).replace(f"{f}: ", "", 1))
        return pieces
    if kind == "docbank":
        from gsdistill.tuples.sources.docbank import _image_index
        if not root.exists():
            raise DataError(f"{root}: no such file or folder")
        files = [root] if root.is_file() else token_files(root, skips, exclude)
        files = files[:limit] if limit else files  # one token file's bytes may go with two page images
        base = Path(cfg.docbank.images_dir) if cfg.docbank.images_dir else (root.parent if root.is_file() else root)
        images = _image_index(base) or (_image_index(base.parent) if root.is_file() else {})
        return [Piece(str(f), None, 0, 1, splittable=False, image=str(images[f.stem]) if f.stem in images else None,
                      stamp=_stamp(f))
                for f in files]
    raise DataError(f"unknown builder {kind!r}; choose one of {', '.join(KINDS)}")


def pack_units(pieces: list[Piece], pages_per_shard: int, max_pages: int | None = None) -> list[list[Piece]]:
    """Pieces in order, cut to ``max_pages`` planned pages and packed ``pages_per_shard`` to a unit."""
    units, unit, filled, planned = [], [], 0, 0
    for p in pieces:
        first, left = p.first, p.count
        if max_pages is not None:
            left = min(left, max_pages - planned)
        while left > 0:
            take = min(left, pages_per_shard - filled) if p.splittable else left
            if not p.splittable and filled and filled + take > pages_per_shard:
                units.append(unit)
                unit, filled = [], 0
            unit.append(Piece(p.file, p.doc_id, first, take, p.splittable, p.image, p.stamp))
            first, left, filled, planned = first + take, left - take, filled + take, planned + take
            if filled >= pages_per_shard:
                units.append(unit)
                unit, filled = [], 0
        if max_pages is not None and planned >= max_pages:
            break
    return units + ([unit] if unit else [])


def make_plan(kind: str, source: str | Path, cfg: DictConfig, exclude: Path | None = None) -> dict:
    """``{kind, source, settings, skipped (inputs refused while planning), units: [[piece, ...], ...]}``;
    ``exclude``: a folder inside the input never read as input (the build's own output folder)."""
    if kind not in KINDS:
        raise DataError(f"unknown builder {kind!r}; choose one of {', '.join(KINDS)}")
    skips = SkipLog()
    source = str(source) if kind == "synthetic" else str(Path(source).absolute())
    pieces = _pieces(kind, source, cfg, skips, exclude)
    b = cfg.build
    units = pack_units(pieces, int(b.pages_per_shard), None if b.max_pages is None else int(b.max_pages))
    plan = {"kind": kind, "source": source, "settings": build_settings(cfg), "skipped": list(skips),
            "units": [[asdict(p) for p in unit] for unit in units]}
    return json.loads(json.dumps(plan))  # the form it has after a round trip through plan.json
