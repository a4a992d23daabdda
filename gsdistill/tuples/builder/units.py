"""One build unit: its planned pieces -> ``shard-{u:06d}.tar`` + a done-record ``units/unit-{u:06d}.json``.

A unit is built by one worker, alone and single-threaded, and depends on nothing but its job, so
any number of workers (processes, Ray tasks on other machines) write the same bytes. The shard is
written under a temporary name and renamed, then the record (pieces, page ids, shard size and
sha256, counts for the manifest, skips) the same way: a unit counts as done only when its record
exists and the shard on disk still has that size and sha256 (``verified_record``, run again on every
resume). A build killed at any point (kill -9 included) leaves at most temporary files and shards
without a record, which the next run rebuilds.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
from itertools import islice
from pathlib import Path
from typing import Iterator

from omegaconf import DictConfig, OmegaConf

from gsdistill.tuples.builder import inputs
from gsdistill.tuples.builder.inputs import file_sha256, per_file
from gsdistill.tuples.builder.plan import Piece
from gsdistill.tuples.errors import SkipLog, writing
from gsdistill.tuples.store.writer import PageStats, _add, accept_page, page_members, sample_key

UNITS_DIR = "units"


def shard_name(unit: int) -> str:
    return f"shard-{unit:06d}.tar"


def record_path(out: Path, unit: int) -> Path:
    return out / UNITS_DIR / f"unit-{unit:06d}.json"


def write_atomic(path: Path, data: bytes) -> None:
    """Write beside ``path`` under a name of this process, then rename: readers see all or nothing."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with writing(path):
        tmp.write_bytes(data)
        tmp.replace(path)


def piece_pages(kind: str, source: str, piece: Piece, cfg: DictConfig, skips: SkipLog, ocr) -> Iterator[dict]:
    """The page tuples of one planned piece (builder skips go to ``skips``)."""
    if kind == "synthetic":
        from gsdistill.tuples.sources.synthetic import generate_pages
        s = cfg.synthetic
        return generate_pages(piece.count, seed=int(s.seed), width=int(s.width), height=int(s.height),
                              start=piece.first, pages_per_doc=int(s.pages_per_doc),
                              text_scale=float(s.text_scale))
    if kind == "pdf":
        from gsdistill.tuples.sources.pdf import pdf_pages
        p = cfg.pdf
        return pdf_pages(piece.file, dpi=int(p.dpi), skips=skips, max_page_count=int(p.max_page_count),
                         max_page_side_pt=float(p.max_page_side_pt), max_pixels=int(p.max_pixels),
                         ocr_fn=ocr if p.ocr_empty_pages else None, doc_id=piece.doc_id,
                         first_page=piece.first, max_pages=piece.count)
    if kind == "images":
        from gsdistill.tuples.sources.images import image_pages
        return image_pages(piece.file, skips=skips, ocr_fn=ocr, doc_id=piece.doc_id,
                           max_pixels=int(cfg.images.max_pixels))
    if kind == "coco":
        from gsdistill.tuples.sources.coco import coco_pages
        c = cfg.coco
        return islice(coco_pages(piece.file, images_dir=c.images_dir, text_dir=c.text_dir, source=c.source,
                                 ocr_fn=ocr, skips=skips, max_pixels=int(cfg.images.max_pixels)), piece.count)
    if kind == "docbank":
        from gsdistill.tuples.sources.docbank import docbank_pages
        root = Path(source)
        base = cfg.docbank.images_dir or (root.parent if root.is_file() else root)
        index = {Path(piece.file).stem: Path(piece.image)} if piece.image else {}
        return docbank_pages(piece.file, skips=skips, images_dir=base, max_pixels=int(cfg.images.max_pixels),
                             image_index=index)
    raise ValueError(f"unknown builder {kind!r}")


def build_unit(job: dict) -> dict:
    """Build unit ``job['unit']`` into ``job['out']`` and return its record (also written to disk)."""
    out, unit, kind = Path(job["out"]), int(job["unit"]), job["kind"]
    cfg = OmegaConf.create(job["cfg"])
    b = cfg.build
    pieces = [Piece(**p) for p in job["pieces"]]
    # looked up on its module at call time: a replaced OCR function reaches forked workers too
    ocr = inputs.ocr_function(cfg) if kind in ("images", "coco") or (kind == "pdf" and cfg.pdf.ocr_empty_pages) else None
    skips, seen, stats, page_ids = SkipLog(), set(), PageStats(), []
    shard = out / shard_name(unit)
    tmp = shard.with_name(f"{shard.name}.{os.getpid()}.tmp")
    with writing(shard), tarfile.open(tmp, "w") as tar:
        pages = per_file(pieces, lambda p: piece_pages(kind, job["source"], p, cfg, skips, ocr), skips,
                         name=lambda p: p.file or "synthetic")
        for page in pages:
            key = accept_page(page, seen, skips)
            if key is not None:
                for ext, data in page_members(page, key, b.image_format, int(b.jpeg_quality)):
                    _add(tar, f"{key}.{ext}", data)
                stats.add(page)
                page_ids.append(str(page["id"]))
    record = {"unit": unit, "pieces": job["pieces"], "shard": None, "pages": len(page_ids), "bytes": 0,
              "sha256": None, "page_ids": page_ids, "summary": stats.summary(), "skipped": list(skips)}
    if page_ids:
        tmp.replace(shard)
        record.update(shard=shard.name, bytes=shard.stat().st_size, sha256=file_sha256(shard))
    else:  # every page skipped: no shard, the record keeps the skips
        tmp.unlink()
    write_atomic(record_path(out, unit), json.dumps(record, ensure_ascii=False).encode())
    return record


def verified_record(out: Path, unit: int, pieces: list[dict]) -> dict | None:
    """The unit's record when the unit is really done (same pieces, shard of that size and sha256)."""
    try:
        record = json.loads(record_path(out, unit).read_text())
    except (OSError, ValueError):
        return None
    if record.get("unit") != unit or record.get("pieces") != pieces:
        return None
    if record["shard"] is None:
        return record if record["pages"] == 0 else None
    shard = out / record["shard"]
    if not shard.is_file() or shard.stat().st_size != record["bytes"] or file_sha256(shard) != record["sha256"]:
        return None
    return record


def drop_pages(out: Path, record: dict, drop_ids: set[str], reason: str) -> dict:
    """Rewrite the unit's shard without the pages ``drop_ids`` (ids an earlier unit already wrote),
    recount it, record each dropped page as a skip; the new record is written after the new shard."""
    shard = out / record["shard"]
    drop_keys = {sample_key(pid) for pid in drop_ids}
    stats, buf = PageStats(), io.BytesIO()
    with tarfile.open(shard) as src, tarfile.open(fileobj=buf, mode="w") as dst:
        for member in src.getmembers():
            key, ext = member.name.rsplit(".", 1)
            if key in drop_keys:
                continue
            data = src.extractfile(member).read()
            _add(dst, member.name, data)
            if ext == "json":
                stats.add(json.loads(data))
    kept = [pid for pid in record["page_ids"] if pid not in drop_ids]
    record = dict(record, page_ids=kept, pages=len(kept), summary=stats.summary(),
                  skipped=record["skipped"] + [{"source": pid, "reason": reason} for pid in record["page_ids"]
                                               if pid in drop_ids])
    if kept:
        write_atomic(shard, buf.getvalue())
        record.update(bytes=shard.stat().st_size, sha256=file_sha256(shard))
    else:
        from gsdistill.output_removal import discard
        discard(shard)  # the build's own shard (never through a link)
        record.update(shard=None, bytes=0, sha256=None)
    write_atomic(record_path(out, record["unit"]), json.dumps(record, ensure_ascii=False).encode())
    return record
