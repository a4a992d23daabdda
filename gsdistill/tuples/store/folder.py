"""A shard folder as an output: what gsdistill wrote in it, whose output it is, and ``--overwrite``.

``tuples build`` and ``eval split`` write into folders that may already hold shards. Before anything
is written they ask :func:`origin` whose output the folder is (a build of some input, a split of
some shard folder) and refuse a folder holding another corpus's shards with
:class:`FolderTaken` (exit code 2: the folder, what it holds, "choose another folder or pass
--overwrite"), instead of replacing its manifest and leaving that corpus's ``embeddings/`` and
``units/`` beside the new one. What is "ours" is decided by the folder's record of what gsdistill
wrote there (:mod:`gsdistill.output_manifest`); in a folder from before records, by the names listed
here (:data:`SHARD_FOLDER`), and only when it is recognisably a shard folder. ``--overwrite`` calls
:func:`clear`, which removes only what is ours, never a file of the user's, never through a link.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gsdistill.errors import GsdistillError
from gsdistill.output_manifest import Layout
from gsdistill.output_removal import inventory, remove_written

# files gsdistill writes at the top of a shard folder, and per sub-folder the names it writes there
TOP_FILES = ("manifest.json", "skipped.csv", "split.json", "config.yaml")
TOP_GLOBS = ("shard-*.tar", "shard-*.tmp", "manifest.json.*.tmp")
SUB_GLOBS = {"units": ("plan.json", "unit-*.json", "*.tmp"), "embeddings": ("meta.json", "*.npz", "*.tmp")}
_LEGACY = TOP_FILES + TOP_GLOBS + tuple(f"{sub}/{g}" for sub, globs in SUB_GLOBS.items() for g in globs)
_MARKERS = ("manifest.json", "split.json", "shard-*.tar", "units/plan.json", "units/unit-*.json",
            "embeddings/meta.json", "embeddings/*.npz")
# a folder without a record is recognisably a shard folder when it holds one of these groups together
_SIGNATURE = (("manifest.json", "shard-*.tar"), ("manifest.json", "skipped.csv"), ("split.json", "shard-*.tar"),
              ("units/plan.json",), ("units/unit-*.json",), ("embeddings/meta.json",))
# a shard folder as any command writing one sees it (build, split, embed, pretraining's synthetic data)
SHARD_FOLDER = Layout("a shard folder", TOP_FILES + TOP_GLOBS + tuple(SUB_GLOBS), _LEGACY, _MARKERS, _SIGNATURE)
# what ``tuples build`` writes (the embedding cache goes into its embeddings/ later) ...
BUILD = Layout("tuples build", ("manifest.json", "skipped.csv", "config.yaml") + TOP_GLOBS + tuple(SUB_GLOBS),
               _LEGACY, _MARKERS, _SIGNATURE)
# ... and one side of ``eval split`` (no config.yaml, no skipped.csv)
SPLIT = Layout("eval split", ("manifest.json", "split.json", "shard-*.tar", "shard-*.tmp"), _LEGACY, _MARKERS,
               _SIGNATURE)


_RESULT = Layout("a result", markers=tuple(m for m in _MARKERS if m != "units/plan.json"))


class FolderTaken(GsdistillError, ValueError):
    """An output folder that holds another corpus's shards (or another command's output)."""


def written_files(folder: Path) -> list[Path]:
    """Every file of ``folder`` gsdistill wrote (its record; in a folder without one, the names a shard
    folder holds), sorted."""
    folder = Path(folder)
    inv = inventory(folder, SHARD_FOLDER)
    return sorted(folder / p for p in inv.ours if inv.entries[p] != "d")


def holds_shards(folder: Path) -> bool:
    """The folder holds a result gsdistill wrote (shards, a manifest, build records, embeddings, a
    split record): something a new output would replace or mix with. A lone config.yaml or
    plan.json does not count, nor any file gsdistill did not write."""
    return bool(inventory(folder, SHARD_FOLDER).ours_matching(_RESULT))


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
    ours = {str(p.relative_to(folder)) for p in written_files(Path(folder))}
    parts = []
    shards = len([p for p in ours if "/" not in p and p.startswith("shard-") and p.endswith(".tar")])
    if shards:
        parts.append(f"{shards} shard{'s' if shards != 1 else ''}")
    parts += [n for n in ("manifest.json", "split.json") if n in ours]
    parts += [f"{sub}/" for sub in SUB_GLOBS if any(p.startswith(sub + "/") for p in ours)]
    return ", ".join(parts) or "nothing"


def refuse(folder: Path, option: str, why: str) -> FolderTaken:
    """The one-line refusal for an output folder that holds another output."""
    return FolderTaken(f"{option} {folder}: holds {origin(folder)} ({contents(folder)}); {why}; choose another "
                       "folder, or pass --overwrite to remove those files (only what gsdistill wrote there) first")


def clear(folder: Path):
    """Remove what gsdistill wrote in a shard folder (:func:`gsdistill.output_removal.remove_written`:
    by its record, never through a link, never a file of the user's) and the folders of ours left
    empty. Returns the :class:`~gsdistill.output_removal.Removal` (``removed``, ``kept``)."""
    return remove_written(folder, SHARD_FOLDER)


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
