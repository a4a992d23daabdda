"""What is whose in an output folder, and the one way anything in one is removed.

**Ownership.** A path below FOLDER is *ours* when the record lists it as written (or the present
session made it). It is *unknown* when it was there before the folder had a record (written by a
gsdistill from before records, or the user's own); unknown paths count as ours only where the
command's :class:`Layout` names them (exact names and patterns, never a whole sub-folder of unknown
files) and the folder is recognisably that command's output (one of the layout's markers is
there). Anything else is the user's (*foreign*): never removed, never written over.

**Removal.** :func:`remove_written` is the only way gsdistill removes anything from an output folder:
``--overwrite``, a rebuild, a split or conversion replaced, a checkpoint replaced or pruned. It walks
the real folder without following links (a link may be removed, never what it points to), removes
only the files and links that are ours, each checked to lie inside the folder after resolving its
parent, then the folders it left empty that are ours; it returns what it removed and what it kept.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, NamedTuple

from gsdistill.output_manifest import (EVERYTHING, RECORD_NAME, Layout, held, inside, own_name, read_record,
                                       real_path, scan, session_of, write_record)


# ---- ownership --------------------------------------------------------------------------------------
class Inventory(NamedTuple):
    """What ``folder`` holds: every entry (relative path -> kind), those that are ours, and the rest."""
    folder: Path
    entries: dict[str, str]
    ours: set[str]
    recognised: bool

    @property
    def foreign(self) -> list[str]:
        """Files and links that are not ours (folders only hold them), sorted."""
        return sorted(p for p, k in self.entries.items() if k != "d" and p not in self.ours)

    def ours_matching(self, layout: Layout) -> list[str]:
        """Our paths that are markers of ``layout`` (an earlier result), sorted."""
        return sorted(p for p in self.ours if layout.marker(p))

    def clashes(self, layout: Layout) -> list[str]:
        """Top-level entries the command writes that are not ours: a file or link of the user's, or a
        folder gsdistill did not make holding a file of the user's (an empty one is no clash, nor a
        folder of ours holding a file of the user's: it is written beside)."""
        foreign = self.foreign
        return sorted(p + ("/" if k == "d" else "") for p, k in self.entries.items()
                      if "/" not in p and layout.written_name(p) and p not in self.ours
                      and (k != "d" or any(f.startswith(p + "/") for f in foreign)))


def inventory(folder: str | Path, layout: Layout | None = None, under: Iterable[str] | None = None) -> Inventory:
    """Sort what ``folder`` holds (only at and below ``under`` when given) into ours and not ours
    (module docstring). ``layout`` decides about unknown paths (a folder without a record); without
    one they are not ours. Below a sub-folder that is ours, that sub-folder's own record counts too
    (the shard folder ``data/`` a run made, embedded later under its own lock); a sub-folder that is
    not ours (a build of the user's inside their project folder) stays the user's, records and all."""
    folder = Path(folder)
    under = None if under is None else [u.strip("/") for u in under if u.strip("/")]
    entries = scan(folder, under) if folder.is_dir() else {}
    session = held(folder)
    rec = None if session is not None else read_record(folder)
    if session is not None:
        written, unknown_all = session.written, session.unknown
        start = session.start
    else:
        written, unknown_all = (rec["written"], rec["unknown"]) if rec else (set(), None)
        start = None

    def new(p: str) -> bool:  # made in this process's session of the folder
        return start is not None and p not in start

    def is_unknown(p: str) -> bool:
        return (p in unknown_all) if unknown_all is not None else True

    recognised = False
    if layout is not None:
        if layout is EVERYTHING:
            recognised = True
        else:
            every = scan(folder) if under is not None else entries
            recognised = layout.recognises([p for p in every if is_unknown(p) and p not in written and not new(p)])

    def top_ours(p: str, kind: str) -> bool:
        if p in written or new(p):
            return True
        return recognised and is_unknown(p) and (layout.legacy_folder(p) if kind == "d" else layout.legacy_file(p))

    nested: set[str] = set()  # what the records of sub-folders that are ours list
    subs = sorted({rel.rsplit("/", i)[0] for rel in entries for i in range(1, rel.count("/") + 1)} |
                  {p for p, k in entries.items() if k == "d"}, key=lambda p: p.count("/"))
    for sub in subs:
        if not (top_ours(sub, "d") or sub in nested):
            continue
        sub_session = held(folder / sub)
        if sub_session is not None:
            listed = sub_session.written | (scan(folder / sub).keys() - sub_session.start)
        else:
            sub_rec = read_record(folder / sub)
            listed = sub_rec["written"] if sub_rec is not None else set()
        nested |= {f"{sub}/{p}" for p in listed | {RECORD_NAME}}
    ours = {p for p, k in entries.items() if top_ours(p, k) or p in nested}
    return Inventory(folder, entries, ours, recognised)


# ---- removal ----------------------------------------------------------------------------------------
class Removal(NamedTuple):
    removed: list[str]  # relative paths removed (folders end in "/")
    kept: list[str]  # files and links in the scope that were not ours, left as they were

    def __bool__(self) -> bool:
        return bool(self.removed)


def remove_written(folder: str | Path, layout: Layout | None = None, under: Iterable[str] | None = None) -> Removal:
    """Remove from ``folder`` what gsdistill wrote there (only below the relative paths ``under`` when
    given): files and links that are ours, never what a link points to, each checked to lie inside
    the folder after resolving; then the folders of ours it left empty. Everything else stays."""
    folder = Path(folder)
    scope = None if under is None else [u.strip("/") for u in under]
    if scope is not None and not [u for u in scope if u]:
        return Removal([], [])
    inv = inventory(folder, layout, scope)

    def in_scope(rel: str) -> bool:
        return scope is None or any(rel == u or rel.startswith(u + "/") for u in scope)

    root = real_path(folder)
    removed, kept = [], []
    for rel, kind in sorted(inv.entries.items()):
        if kind == "d" or not in_scope(rel) or own_name(rel.rsplit("/", 1)[-1]):
            continue  # a sub-folder's record goes with its folder (below), its lock never
        path = os.path.join(folder, rel)
        if rel not in inv.ours or not inside(real_path(os.path.dirname(path)), root):
            kept.append(rel)
            continue
        try:
            os.unlink(path)  # a link itself, never its target
        except FileNotFoundError:
            continue
        except OSError:
            kept.append(rel)
            continue
        removed.append(rel)
    for rel in sorted((p for p, k in inv.entries.items() if k == "d" and in_scope(p) and p in inv.ours),
                      key=lambda p: -p.count("/")):
        path = os.path.join(folder, rel)
        if not inside(real_path(os.path.dirname(path)), root):
            continue
        try:
            if os.listdir(path) == [RECORD_NAME] and not os.path.islink(os.path.join(path, RECORD_NAME)):
                os.unlink(os.path.join(path, RECORD_NAME))  # the record of a folder now empty
                removed.append(f"{rel}/{RECORD_NAME}")
            os.rmdir(path)  # only when empty: a file of the user's keeps its folder; a link is no folder
        except OSError:
            continue
        removed.append(rel + "/")
    session = held(folder)
    if session is not None and removed:
        gone = {r.rstrip("/") for r in removed}
        session.start -= gone
        session.written -= gone
        session.unknown -= gone
    elif removed:  # outside a session (a Python caller without the lock): keep the record true
        rec = read_record(folder)
        if rec is not None:
            gone = {r.rstrip("/") for r in removed}
            write_record(folder, rec["written"] - gone, rec["unknown"] - gone)
    return Removal(removed, kept)


def discard(path: str | Path) -> Removal:
    """Remove ``path`` (a file or folder this command or an earlier one of gsdistill wrote: a checkpoint
    replaced or pruned, a staging folder, a split's labels made again) by :func:`remove_written` in the
    folder this process holds around it (else in its parent folder): links are removed, never
    followed; files of the user's inside stay (and are returned as kept)."""
    path = Path(path)
    session = session_of(path)
    root = session.folder if session is not None else path.parent
    real = os.path.join(real_path(path.parent), path.name)
    rel = os.path.relpath(real, real_path(root))
    if rel.startswith(".."):
        return Removal([], [])
    return remove_written(root, EVERYTHING, under=[rel])


def describe(paths: Iterable[str], limit: int = 4) -> str:
    """``paths`` in a few words: top-level names, a folder with how many files in it."""
    groups: dict[str, int] = {}
    for p in paths:
        top, _, rest = p.rstrip("/").partition("/")
        key = top + "/" if (rest or p.endswith("/")) else top
        groups[key] = groups.get(key, 0) + (1 if (rest and not p.endswith("/")) else 0)
    words = [f"{k} ({n} file{'s' if n != 1 else ''})" if k.endswith("/") and n else k for k, n in groups.items()]
    return ", ".join(words[:limit]) + (f" and {len(words) - limit} more" if len(words) > limit else "")
