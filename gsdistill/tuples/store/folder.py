"""A shard folder as an output: what gsdistill wrote in it, whose output it is, and ``--overwrite``.

``tuples build`` and ``eval split`` write into folders that may already hold shards. Before anything
is written they ask :func:`origin` whose output the folder is (a build of some input, a split of
some shard folder) and refuse a folder holding another corpus's shards with
:class:`FolderTaken` (exit code 2: the folder, what it holds, "choose another folder or pass
--overwrite"), instead of replacing its manifest and leaving that corpus's ``embeddings/`` and
``units/`` beside the new one. ``--overwrite`` calls :func:`clear`, which removes only the files
listed here (the names gsdistill writes), never a file of the user's.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gsdistill.errors import GsdistillError

# files gsdistill writes at the top of a shard folder, and per sub-folder the names it writes there
TOP_FILES = ("manifest.json", "skipped.csv", "split.json", "config.yaml")
TOP_GLOBS = ("shard-*.tar", "shard-*.tmp", "manifest.json.*.tmp")
SUB_GLOBS = {"units": ("plan.json", "unit-*.json", "*.tmp"), "embeddings": ("meta.json", "*.npz", "*.tmp")}


class FolderTaken(GsdistillError, ValueError):
    """An output folder that holds another corpus's shards (or another command's output)."""


def written_files(folder: Path) -> list[Path]:
    """Every file of ``folder`` with a name gsdistill writes in a shard folder (sorted)."""
    folder = Path(folder)
    found = [folder / n for n in TOP_FILES if (folder / n).is_file()]
    found += [p for g in TOP_GLOBS for p in folder.glob(g) if p.is_file()]
    for sub, globs in SUB_GLOBS.items():
        found += [p for g in globs for p in (folder / sub).glob(g) if p.is_file()]
    return sorted(set(found))


def holds_shards(folder: Path) -> bool:
    """The folder holds a result (shards, a manifest, build records, embeddings, a split record):
    something a new output would replace or mix with. A lone config.yaml or plan.json does not count."""
    folder = Path(folder)
    if (folder / "manifest.json").is_file() or (folder / "split.json").is_file():
        return True
    if any(folder.glob("shard-*.tar")) or any((folder / "units").glob("unit-*.json")):
        return True
    return (folder / "embeddings" / "meta.json").is_file() or any((folder / "embeddings").glob("*.npz"))


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def build_plan_of(folder: Path) -> dict | None:
    """The plan of the build that wrote ``folder`` (``units/plan.json``), or None."""
    return _json(Path(folder) / "units" / "plan.json")


def split_record_of(folder: Path) -> dict | None:
    """The record of the ``eval split`` that wrote ``folder`` (``split.json``), or None."""
    return _json(Path(folder) / "split.json")


def origin(folder: Path) -> str:
    """Whose output ``folder`` is, in words: "a build of pdf /data/in", "a split of /data/all", ..."""
    plan = build_plan_of(folder)
    if plan and plan.get("kind"):
        return f"a build of {plan['kind']} {plan.get('source')}"
    split = split_record_of(folder)
    if split and split.get("source"):
        return f"a split of {split['source']}"
    return "shards of an unknown build (no build plan, no split record)"


def contents(folder: Path) -> str:
    """What ``folder`` holds that gsdistill wrote: "3 shards, manifest.json, embeddings/, units/"."""
    folder = Path(folder)
    parts = []
    shards = len(list(folder.glob("shard-*.tar")))
    if shards:
        parts.append(f"{shards} shard{'s' if shards != 1 else ''}")
    parts += [n for n in ("manifest.json", "split.json") if (folder / n).is_file()]
    parts += [f"{sub}/" for sub in SUB_GLOBS if any(p.parent.name == sub for p in written_files(folder))]
    return ", ".join(parts) or "nothing"


def refuse(folder: Path, option: str, why: str) -> FolderTaken:
    """The one-line refusal for an output folder that holds another output."""
    return FolderTaken(f"{option} {folder}: holds {origin(folder)} ({contents(folder)}); {why}; choose another "
                       "folder, or pass --overwrite to remove those files (only what gsdistill wrote there) first")


def clear(folder: Path) -> int:
    """Remove every file gsdistill writes in a shard folder (``written_files``) and the sub-folders
    left empty by that; the user's own files stay. Returns how many files were removed."""
    files = written_files(folder)
    for path in files:
        path.unlink(missing_ok=True)
    for sub in SUB_GLOBS:
        try:
            (Path(folder) / sub).rmdir()  # only when empty: a file of the user's keeps it
        except OSError:
            pass
    return len(files)


@contextmanager
def removed_if_left_empty(*folders: Path) -> Iterator[None]:
    """Output folders that do not exist yet are removed again when the block fails and leaves them
    empty: a refused or failed command leaves no empty folder behind (wrap it around the lock)."""
    new = [Path(f) for f in folders if not Path(f).exists()]
    try:
        yield
    except BaseException:
        for folder in new:
            try:
                folder.rmdir()
            except OSError:  # it holds something now, or was never made
                pass
        raise
