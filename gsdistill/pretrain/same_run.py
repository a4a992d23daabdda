"""A resumed pretraining run is the same run: the keys a resume may not change, the data it must read
again, and the run's record of every start and resume (``RUN_DIR/history.jsonl``, kept by
:mod:`gsdistill.run_history`, as the text retrievers keep theirs).

A key that changes what a step *is* (the data and how it is cut into views, the model, the
objective, the batch, the seed) is refused on resume unless ``train.resume_changes=allow``; the
schedule's length, checkpointing, logging and the machine (``optim.steps``, ``train.stop_after``,
``train.ckpt_every``, ``threads``, ``train.device``, ``data.num_workers``, ...) may change. Either
way the changed keys are written to ``history.jsonl``.

The data: ``data.shards`` is made absolute at start (a relative one against the working directory
of that start), so the saved config names the same folder wherever a resume is started from; each
checkpoint's ``state.json`` records the folder read, the SHA-256 of its ``manifest.json`` and of every
shard's content (the build records each shard's sha256 in the manifest; only a shard whose size or
modification time changed since is read again), and a resume whose data differs (rebuilt, replaced,
another folder, a page edited inside a shard) is refused in one line. A checkpoint of a run started
before shard contents were recorded is checked by its manifest alone, said once in one line.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

from omegaconf import OmegaConf

from gsdistill import run_history
from gsdistill.errors import InputError
from gsdistill.tuples.store.writer import file_sha256

ALLOW_KEY = "train.resume_changes"
# per-invocation keys: never carried over from the resumed checkpoint, never reported as changes
NOT_CARRIED = ("train.resume", "train.stop_after", ALLOW_KEY)
# keys that change what a step is: the pages and their views, the network and its losses, the batch,
# and the seed (the data order and the augmentations derive from it)
FIXED = ("model.", "views.", "objective.", "optim.batch_size", "train.seed", "data.shards", "data.synthetic_pages",
         "data.synthetic_seed", "data.page_width", "data.page_height", "data.text_scale", "data.shuffle_buffer",
         "data.descriptor_format",
         # restored with the optimizer's state on resume (torch keeps a checkpoint's group options): a
         # change would be printed as applied and silently not be
         "optim.weight_decay", "optim.betas", "optim.eps")
MANIFEST = "manifest.json"


def absolute_shards(cfg) -> None:
    """``data.shards`` as an absolute path, in place (a relative one against the working directory)."""
    shards = cfg["data"]["shards"]
    if shards:
        cfg["data"]["shards"] = os.path.abspath(os.path.expanduser(str(shards)))


def changes_since(saved, cfg) -> dict[str, tuple]:
    """``{key: (old, new)}`` between a checkpoint's config and this start's. A checkpoint written before
    the data folder was saved absolute has it resolved as that run did, against the working directory."""
    saved = OmegaConf.create(OmegaConf.to_container(saved, resolve=True)) if not isinstance(saved, dict) \
        else copy.deepcopy(saved)
    absolute_shards(saved)
    return run_history.config_changes(saved, cfg, ignore=NOT_CARRIED)


def describe(changes: dict[str, tuple]) -> list[str]:
    """``key: old -> new`` per change (what the run prints when it resumes)."""
    return [f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items()]


def check_changes(changes: dict[str, tuple], cfg, ckpt: Path) -> None:
    """InputError when ``changes`` touch :data:`FIXED` and the user did not allow it."""
    run_history.check_resume(changes, FIXED, cfg["train"]["resume_changes"], ckpt, ALLOW_KEY)


def _shard_stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def data_record(folder: str | Path, before: dict | None = None) -> dict:
    """``{"folder", "manifest_sha256", "shards": {name: [sha256, bytes, mtime_ns]}, "sha256"}`` of the
    shard folder a run reads: ``sha256`` covers the manifest and every shard's content.

    Cheap: a shard's sha256 is taken from the manifest (recorded by the build; computed here for
    shards of older builds) when its size is the manifest's, and from ``before`` (the record of the
    checkpoint resumed) when its size and modification time are those recorded there; only a shard
    whose size or time changed since is read and hashed again."""
    folder = Path(os.path.abspath(folder))
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return {"folder": str(folder), "manifest_sha256": None}
    raw = manifest.read_bytes()
    try:
        listed = json.loads(raw).get("shards") or []
    except (ValueError, AttributeError):
        listed = []
    known = (before or {}).get("shards") or {}
    shards = {}
    for entry in listed:
        name = str(entry.get("name"))
        stat = _shard_stat(folder / name)
        if stat is None:
            shards[name] = [None, None, None]
        elif name in known and known[name][1:] == stat:
            shards[name] = [known[name][0], *stat]
        elif before is None and entry.get("sha256") and entry.get("bytes") == stat[0]:
            shards[name] = [entry["sha256"], *stat]
        else:
            shards[name] = [file_sha256(folder / name), *stat]
    whole = hashlib.sha256(raw)
    for name, (sha, *_) in shards.items():
        whole.update(f"\0{name}\0{sha}".encode())
    return {"folder": str(folder), "manifest_sha256": hashlib.sha256(raw).hexdigest(), "shards": shards,
            "sha256": whole.hexdigest()}


def check_data(state: dict, folder: str | Path, ckpt: Path) -> tuple[dict, str | None]:
    """The data record of ``folder`` now and a one-line note (or None); InputError when the data
    differs from what checkpoint ``ckpt`` trained on: its manifest, or the content of any shard (an
    edited page inside a shard whose manifest stayed the same). A checkpoint written before shard
    contents were recorded is checked by its manifest alone, said in the note (its resume records
    them, so the next resume checks them)."""
    before = state.get("data") if isinstance(state, dict) else None
    known = before["shards"] if isinstance(before, dict) and isinstance(before.get("shards"), dict) else None
    now = data_record(folder, before if known is not None else None)
    if not isinstance(before, dict) or not before.get("manifest_sha256"):
        return now, (f"{ckpt} was written before runs recorded their data: the data folder is not checked "
                     "against it this once; checkpoints from now on record it")
    where = f"not the data the run of {ckpt} trained on"
    if before["manifest_sha256"] != now["manifest_sha256"]:
        raise InputError(f"{Path(now['folder']) / MANIFEST}: {where} (it read "
                         f"{before.get('folder')}, manifest sha256 {before['manifest_sha256'][:12]}; now "
                         f"{str(now['manifest_sha256'])[:12]}); {_RESUME_SAME_DATA}")
    if known is None:
        return now, (f"{ckpt} was written before runs recorded their shards' contents: the data is checked "
                     "by manifest.json alone this once; checkpoints from now on record the shards' sha256")
    changed = [name for name, rec in known.items() if now["shards"].get(name, [None])[0] != rec[0]]
    if changed:
        raise InputError(f"{Path(now['folder']) / changed[0]}: the data changed: {where} (its sha256 "
                         f"{str(known[changed[0]][0])[:12]}, now {str(now['shards'].get(changed[0], [None])[0])[:12]}"
                         f"{f'; {len(changed) - 1} more shards changed' if len(changed) > 1 else ''}); "
                         f"{_RESUME_SAME_DATA}")
    return now, None


_RESUME_SAME_DATA = ("a resume reads exactly the data its run started with: resume in the run's own folder, "
                     "restore that data, or start a new run")
