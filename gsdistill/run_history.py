"""A resumed run is the same run: which config keys a resume may change, and the run's own record of
every start and resume (``RUN_DIR/history.jsonl``).

A resume continues a run from a checkpoint's step and data position. A key that changes what a step
*is* (the batch size, the seed, the data, the model) would silently turn the rest into another run
whose first steps are not recorded anywhere: such a change is refused (:func:`check_resume`) unless
the user asks for it (``train.resume_changes=allow``). Every start and resume, with the keys that
changed and the data it read, is appended to ``history.jsonl``, so the run folder says afterwards
which steps ran under which config. Used by pretraining and the text retrievers alike.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Iterable

from omegaconf import OmegaConf

from gsdistill.errors import InputError

HISTORY = "history.jsonl"
ALLOW = "allow"


def flat(cfg, prefix: str = "") -> dict:
    """``{"a.b.c": value}`` of a (resolved) config or plain dict."""
    tree = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)
    out = {}
    for k, v in (tree or {}).items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(before, after, ignore: Iterable[str] = ()) -> dict[str, tuple]:
    """``{key: (old, new)}`` for every value that differs between two resolved configs (keys in
    ``ignore``, and keys below an ignored prefix ending in ``.``, left out)."""
    a, b = flat(before), flat(after)
    ignore = tuple(ignore)

    def ignored(k: str) -> bool:
        return any(k == i or (i.endswith(".") and k.startswith(i)) for i in ignore)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and not ignored(k)}


def describe(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())


def fixed_changes(changes: dict[str, tuple], fixed: Iterable[str]) -> dict[str, tuple]:
    """The changes to keys a resume may not change: ``fixed`` holds keys and prefixes ending in ``.``."""
    fixed = tuple(fixed)
    return {k: v for k, v in changes.items() if any(k == f or (f.endswith(".") and k.startswith(f)) for f in fixed)}


def check_resume(changes: dict[str, tuple], fixed: Iterable[str], allow: str | None, ckpt: Path, key: str) -> None:
    """InputError when the resume changes a key of ``fixed`` and the user did not allow it (``key`` is
    the config key that allows it, set to ``allow``)."""
    bad = fixed_changes(changes, fixed)
    if bad and str(allow or "").lower() != ALLOW:
        raise InputError(f"resume from {ckpt}: {describe(bad)} changed since that checkpoint; a resume continues "
                         f"the same run, and these keys change what its steps are. Resume with the checkpoint's "
                         f"values, start a new run (another run folder), or set {key}={ALLOW} to continue with "
                         f"the change recorded in {HISTORY}")


def record(run_dir: str | Path, event: str, step: int, changes: dict[str, tuple] | None = None, **extra) -> dict:
    """Append one line to ``RUN_DIR/history.jsonl``: the event (``start``, ``resume``, ``stop``), the
    step it happened at, the changed keys and anything else worth knowing (data, world size)."""
    row = {"event": event, "step": int(step), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           "pid": os.getpid(), "host": socket.gethostname()}
    if changes:
        row["changed"] = {k: [old, new] for k, (old, new) in changes.items()}
    row.update(extra)
    path = Path(run_dir) / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=str) + "\n")
    return row


def read(run_dir: str | Path) -> list[dict]:
    """The rows of ``RUN_DIR/history.jsonl`` (empty for a run without one)."""
    path = Path(run_dir) / HISTORY
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
