"""Folder drivers: an input (file or folder) of one kind -> page tuples -> shards + manifest.

Every input file ends up as pages or as a recorded skip with its reason: files of another type
("unsupported file type"), files a builder rejects (``DataError``: corrupt, encrypted, empty, ...)
and files a library fails on unexpectedly ("failed: <error>") are all written to the manifest's
``skipped`` list and to ``skipped.csv`` beside it; the other files' pages are kept.

A build is planned (``build_plan``: which pages go to which shard), then its units are built
(``build_units``: one shard and one done-record each) on an engine (``build_engines``: this
process, a process pool, Ray), then ``manifest.json`` is assembled from the records in unit order.
So the output is the same for any number of workers, and a build started again with the same
command into the same folder keeps every unit whose shard still matches its record and builds only
the rest. A changed input or output-deciding setting starts the folder over.
"""
from __future__ import annotations

import csv
import json
import logging
import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from gsdistill.tuples.build_inputs import KINDS, _doc_id, input_files, ocr_function, per_file  # noqa: F401 (API)
from gsdistill.tuples.errors import DataError, writing

log = logging.getLogger("gsdistill.tuples")


def write_skips_csv(manifest: dict, out_dir: Path) -> Path:
    path = out_dir / "skipped.csv"
    with writing(path), path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["source", "reason"])
        for item in manifest["skipped"]:
            w.writerow([item["source"], item["reason"]])
    return path


def _done_units(out: Path, plan: dict) -> dict[int, dict]:
    """Records of the units already built for this same plan (each shard verified); a folder of
    another plan, or of no plan (an older build), is emptied of shards and records first."""
    from gsdistill.tuples.build_units import UNITS_DIR, verified_record, write_atomic
    from gsdistill.tuples.shard_writer import MANIFEST
    units = out / UNITS_DIR
    units.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # a manifest says "complete": not until the end
    for tmp in [*out.glob("shard-*.tmp"), *units.glob("*.tmp")]:
        tmp.unlink()
    try:
        same = json.loads((units / "plan.json").read_text()) == plan
    except (OSError, ValueError):
        same = False
    if not same:
        for old in out.glob("shard-*.tar"):
            old.unlink()
        shutil.rmtree(units)
        units.mkdir()
        write_atomic(units / "plan.json", json.dumps(plan, ensure_ascii=False).encode())
        return {}
    done = {u: verified_record(out, u, pieces) for u, pieces in enumerate(plan["units"])}
    return {u: record for u, record in done.items() if record is not None}


def _assemble(out: Path, plan: dict, records: dict[int, dict]) -> dict:
    """The manifest from the records in unit order; a page id an earlier unit already wrote (two
    inputs giving the same id) is dropped from the later shard and recorded."""
    from gsdistill.tuples.build_units import drop_pages, write_atomic
    from gsdistill.tuples.shard_writer import DUPLICATE, MANIFEST, PageStats, assemble_manifest, sample_key
    stats, seen, shards, skipped = PageStats(), set(), [], list(plan["skipped"])
    for u in range(len(plan["units"])):
        record = records[u]
        repeated = {pid for pid in record["page_ids"] if sample_key(pid) in seen}
        if repeated:
            record = drop_pages(out, record, repeated, DUPLICATE)
        seen.update(sample_key(pid) for pid in record["page_ids"])
        if record["shard"] is not None:
            shards.append({"name": record["shard"], "pages": record["pages"]})
        stats.merge(record["summary"])
        skipped += record["skipped"]
    manifest = assemble_manifest(shards, stats.summary(), skipped)
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False).encode())
    write_skips_csv(manifest, out)
    return manifest


def build_shards(kind: str, source: str | Path, out_dir: str | Path, cfg: DictConfig) -> dict:
    """Build ``kind`` pages from ``source`` into shards in ``out_dir``; return the manifest.
    Runs on ``build.engine`` with ``build.workers``; resumes a build of the same plan in ``out_dir``."""
    from gsdistill.tuples.build_engines import run_units
    from gsdistill.tuples.build_plan import check_build_config, make_plan
    from gsdistill.tuples.build_units import UNITS_DIR
    if kind not in KINDS:
        raise DataError(f"unknown builder {kind!r}; choose one of {', '.join(KINDS)}")
    check_build_config(cfg)
    out = Path(out_dir).absolute()  # the same folder for workers on other machines (a shared filesystem)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: --out is an existing file, not a folder; name a new or an existing folder")
    plan = make_plan(kind, source, cfg, exclude=out)
    with writing(out / UNITS_DIR):
        records = _done_units(out, plan)
    settings = OmegaConf.to_container(cfg, resolve=True)
    jobs = [{"kind": kind, "source": plan["source"], "cfg": settings, "unit": u, "pieces": pieces, "out": str(out)}
            for u, pieces in enumerate(plan["units"]) if u not in records]
    if records:
        log.warning("resuming %s: %d of %d shards kept (verified), %d to build", out, len(records),
                    len(plan["units"]), len(jobs))
    for record in tqdm(run_units(jobs, cfg.build), total=len(jobs), desc=f"shards -> {out.name}", unit="shard",
                       disable=not cfg.build.progress):
        records[record["unit"]] = record
    return _assemble(out, plan, records)
