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
checkpoint's ``state.json`` records the folder read and the SHA-256 of its ``manifest.json``, and a
resume whose data folder's manifest differs (rebuilt, replaced, another folder) is refused.
"""
from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path

from omegaconf import OmegaConf

from gsdistill import run_history
from gsdistill.errors import InputError

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


def data_record(folder: str | Path) -> dict:
    """``{"folder": absolute path, "manifest_sha256": ...}`` of the shard folder a run reads."""
    folder = Path(os.path.abspath(folder))
    manifest = folder / MANIFEST
    digest = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
    return {"folder": str(folder), "manifest_sha256": digest}


def check_data(state: dict, now: dict, ckpt: Path) -> None:
    """InputError when the data folder's manifest differs from the one checkpoint ``ckpt`` trained on
    (a checkpoint written before data was recorded is not checked)."""
    before = state.get("data") if isinstance(state, dict) else None
    if not isinstance(before, dict) or not before.get("manifest_sha256"):
        return
    if before["manifest_sha256"] != now["manifest_sha256"]:
        raise InputError(f"{Path(now['folder']) / MANIFEST}: not the data the run of {ckpt} trained on (it read "
                         f"{before.get('folder')}, manifest sha256 {before['manifest_sha256'][:12]}; now "
                         f"{str(now['manifest_sha256'])[:12]}); a resume reads exactly the data its run started "
                         "with: resume in the run's own folder, restore that data, or start a new run")
