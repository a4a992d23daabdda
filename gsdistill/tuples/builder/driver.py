"""Folder drivers: an input (file or folder) of one kind -> page tuples -> shards + manifest.

Every input file ends up as pages or as a recorded skip with its reason: files of another type
("unsupported file type"), files a builder rejects (``DataError``: corrupt, encrypted, empty, ...)
and files a library fails on unexpectedly ("failed: <error>") are all written to the manifest's
``skipped`` list and to ``skipped.csv`` beside it; the other files' pages are kept.

A build is planned (``plan``: which pages go to which shard), then its units are built
(``units``: one shard and one done-record each) on an engine (``engines``: this
process, a process pool, Ray), then ``manifest.json`` is assembled from the records in unit order.
So the output is the same for any number of workers, and a build started again with the same
command into the same folder keeps every unit whose shard still matches its record and builds only
the rest. A changed input file or output-deciding setting of the same input (kind and path) starts
the folder over, said in one line; a folder holding any other output (another input's build, a
split, shards of no known build) is refused before anything is written, unless ``overwrite``
(``--overwrite``) removes what gsdistill wrote there first (``store.folder``). The build holds the
folder's lock (``output_folder.lock_folder``, in this process only: workers and Ray tasks write
their units under it) from before planning until ``config.yaml`` is written.
"""
from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from gsdistill.output_folder import check_claim, check_output_dir, lock_folder, remove_earlier
from gsdistill.output_removal import remove_written
from gsdistill.tuples.builder.inputs import KINDS, _doc_id, input_files, ocr_function, per_file  # noqa: F401 (API)
from gsdistill.tuples.errors import DataError, writing
from gsdistill.tuples.store.folder import (BUILD, SHARD_FOLDER, build_plan_of, holds_shards, refuse,
                                          removed_if_left_empty)

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
    """Records of the units already built for this same plan (each shard verified); otherwise (a
    changed input or setting of the same input: ``_claim`` let it through) the folder is emptied of
    shards and records first."""
    from gsdistill.tuples.builder.units import UNITS_DIR, verified_record, write_atomic
    from gsdistill.tuples.store.writer import MANIFEST
    units = out / UNITS_DIR
    units.mkdir(parents=True, exist_ok=True)
    # a manifest says "complete": not until the end; temporary files of a killed build go (only ours: _claim
    # refused a folder where these names are the user's)
    remove_written(out, SHARD_FOLDER, [MANIFEST] + [p.name for p in out.glob("shard-*.tmp")]
                   + [f"{UNITS_DIR}/{p.name}" for p in units.glob("*.tmp")])
    try:
        same = json.loads((units / "plan.json").read_text()) == plan
    except (OSError, ValueError):
        same = False
    if not same:  # only what a build wrote: a file of the user's in units/ stays
        remove_written(out, SHARD_FOLDER, [p.name for p in out.glob("shard-*.tar")]
                       + [f"{UNITS_DIR}/{p.name}" for p in units.iterdir() if p.name != "plan.json"])
        units.mkdir(parents=True, exist_ok=True)
        write_atomic(units / "plan.json", json.dumps(plan, ensure_ascii=False).encode())
        return {}
    done = {u: verified_record(out, u, pieces) for u, pieces in enumerate(plan["units"])}
    return {u: record for u, record in done.items() if record is not None}


def _assemble(out: Path, plan: dict, records: dict[int, dict]) -> dict:
    """The manifest from the records in unit order; a page id an earlier unit already wrote (two
    inputs giving the same id) is dropped from the later shard and recorded."""
    from gsdistill.tuples.builder.units import drop_pages, write_atomic
    from gsdistill.tuples.store.writer import DUPLICATE, MANIFEST, PageStats, assemble_manifest, sample_key
    stats, seen, shards, skipped = PageStats(), set(), [], list(plan["skipped"])
    for u in range(len(plan["units"])):
        record = records[u]
        repeated = {pid for pid in record["page_ids"] if sample_key(pid) in seen}
        if repeated:
            record = drop_pages(out, record, repeated, DUPLICATE)
        seen.update(sample_key(pid) for pid in record["page_ids"])
        if record["shard"] is not None:
            # the shard's size and sha256 (its record's, verified on resume): what a pretraining resume compares
            shards.append({"name": record["shard"], "pages": record["pages"], "bytes": record["bytes"],
                           "sha256": record["sha256"]})
        stats.merge(record["summary"])
        skipped += record["skipped"]
    manifest = assemble_manifest(shards, stats.summary(), skipped)
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False).encode())
    write_skips_csv(manifest, out)
    return manifest


def _input_folders(kind: str, source: str | Path, out: Path, cfg: DictConfig,
                   config_files: list[Path] = ()) -> list[tuple[str, Path]]:
    """What ``--out`` is checked against: the input, the image / text folders a COCO or DocBank build
    reads, and the experiment files (``--config`` and its bases). An ``--out`` strictly inside an
    input *folder* is allowed: the build never reads it (``input_files(exclude=out)``)."""
    configs = [("--config", Path(f)) for f in config_files]
    if kind == "synthetic":
        return configs
    src = Path(source).absolute()
    inside = src.is_dir() and src.resolve() in out.resolve().parents
    folders = [] if inside else [(f"--from {kind}", src)]
    extra = {"coco": ("coco.images_dir", "coco.text_dir"), "docbank": ("docbank.images_dir",)}.get(kind, ())
    return folders + [(key, Path(OmegaConf.select(cfg, key))) for key in extra if OmegaConf.select(cfg, key)] + configs


def check_out(kind: str, source: str | Path, out: Path, cfg: DictConfig, config_files: list[Path] = ()) -> None:
    """``out`` is a folder (or nothing yet), not an input, not inside or around one (the experiment
    file included): checked before a byte is written or the folder is created."""
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: --out is an existing file, not a folder; name a new or an existing folder")
    check_output_dir(out, "--out", inputs=_input_folders(kind, source, out, cfg, config_files))


def _flat(d: dict, prefix: str = "") -> dict:
    flat = {}
    for k, v in d.items():
        flat.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return flat


def _changes(old: dict, new: dict) -> str:
    """What differs between two plans of one input, in words."""
    a, b = _flat(old.get("settings") or {}), _flat(new["settings"])
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if keys:
        return "settings " + ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:3]) + \
            (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    return "its input files (size or modification time)"


def _claim(out: Path, plan: dict, overwrite: bool) -> None:
    """Decide, before anything in ``out`` is written or removed, what becomes of what it holds:
    ``overwrite`` removes what gsdistill wrote there; the same plan resumes; another plan of the same
    input (kind and path) is built again, said in one line; any other output is refused, and so is
    a folder holding only files gsdistill did not write (unless ``overwrite``: they stay). An entry
    the build writes (``config.yaml``, ``units/``, ...) that gsdistill did not write is refused always."""
    inv = check_claim(out, "--out", BUILD, overwrite, fresh=False)
    if overwrite:
        remove_earlier(out, SHARD_FOLDER)
        return
    old = build_plan_of(out) if "units/plan.json" in inv.ours else None
    if old == plan and old is not None:
        return
    if old and old.get("kind") == plan["kind"] and old.get("source") == plan["source"]:
        log.warning("%s: %s changed since its last build: building it again", out, _changes(old, plan))
        return
    if holds_shards(out):
        raise refuse(out, "--out", f"not a build of {plan['kind']} {plan['source']}")
    check_claim(out, "--out", BUILD, overwrite)  # a fresh build: no file of the user's there


def build_shards(kind: str, source: str | Path, out_dir: str | Path, cfg: DictConfig, overwrite: bool = False,
                 save_config: bool = False, config_files: list[Path] = ()) -> dict:
    """Build ``kind`` pages from ``source`` into shards in ``out_dir``; return the manifest.
    Runs on ``build.engine`` with ``build.workers``; resumes a build of the same plan in ``out_dir``;
    refuses a folder holding another output unless ``overwrite`` (see ``_claim``). ``save_config``:
    also write the resolved config as ``out_dir/config.yaml`` (the command does), under the lock.
    ``config_files``: the experiment files the config was read from (inputs: never in ``out_dir``)."""
    if kind not in KINDS:
        raise DataError(f"unknown builder {kind!r}; choose one of {', '.join(KINDS)}")
    from gsdistill.tuples.builder.plan import check_build_config
    check_build_config(cfg)
    from gsdistill.tuples.store.image_codec import stored_format
    stored_format(cfg.build.image_format)  # zst without zstandard: said once here, not by every worker
    out = Path(out_dir).absolute()  # the same folder for workers on other machines (a shared filesystem)
    check_out(kind, source, out, cfg, config_files)
    with removed_if_left_empty(out), lock_folder(out):
        manifest = _build_locked(kind, source, out, cfg, overwrite)
        if save_config:
            from gsdistill.config import save_config as save
            with writing(out / "config.yaml"):
                save(cfg, out)
        return manifest


def _build_locked(kind: str, source: str | Path, out: Path, cfg: DictConfig, overwrite: bool) -> dict:
    from gsdistill.tuples.builder.engines import run_units
    from gsdistill.tuples.builder.plan import make_plan
    from gsdistill.tuples.builder.units import UNITS_DIR
    plan = make_plan(kind, source, cfg, exclude=out)
    _claim(out, plan, overwrite)
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
