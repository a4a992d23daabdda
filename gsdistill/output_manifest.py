"""What gsdistill wrote in an output folder, and the one way anything in one is removed.

**The record.** Every command holds the folders it writes with
:func:`gsdistill.output_folder.lock_folder`. While a folder is held this module keeps a *session*:
what the folder held when the lock was taken. When the lock is released, everything present then
that was not there at the start (files, links and folders: what the command, its pool workers, Ray
tasks and the libraries it calls wrote) is added to the folder's record, ``FOLDER/.gsdistill-files``
(JSON: ``written``, the paths gsdistill wrote, relative to the folder; ``unknown``, what the folder
held before it had a record). A process killed before it released its lock leaves its start time in
the lock file; the next command taking the lock over credits it with what is in no record and was
modified after that time. A file that was there before a session and is rewritten by it stays what
it was (a file of the user's stays the user's).

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

import json
import os
import stat
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Iterable, NamedTuple

RECORD_NAME = ".gsdistill-files"
LOCK_NAME = ".gsdistill.lock"
FORMAT = "gsdistill-written/1"


def _own_name(name: str) -> bool:
    """The record, its temporary file and the lock: bookkeeping, not content."""
    return name == LOCK_NAME or name.startswith(RECORD_NAME)


# ---- layouts: what a command writes, for the checks and for folders without a record -----------------
def _parts(pattern: str) -> tuple[str, ...]:
    return tuple(p for p in pattern.strip("/").split("/") if p)


def _match(parts: tuple[str, ...], pats: tuple[str, ...]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":  # one or more path components
        return any(_match(parts[i:], pats[1:]) for i in range(1, len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], pats[0]) and _match(parts[1:], pats[1:])


def _on_the_way(parts: tuple[str, ...], pats: tuple[str, ...]) -> bool:
    """``parts`` is a folder a path matching ``pats`` lies in."""
    if not parts:
        return bool(pats)
    if not pats:
        return False
    if pats[0] == "**":
        return True
    return fnmatchcase(parts[0], pats[0]) and _on_the_way(parts[1:], pats[1:])


@dataclass(frozen=True)
class Layout:
    """What one command writes into its output folder.

    ``writes``: the top-level names (glob patterns) it writes: an entry there that is not ours is never
    written over, with or without ``--overwrite`` (a link there is never written through).
    ``legacy``: relative paths (glob patterns, ``**`` = any depth) of the files it writes: in a folder
    without a record, the unknown files counted as ours, and only when the folder is recognisably this
    command's output: it holds every pattern of one group of ``signature`` (default: any one of the
    markers). ``markers``: relative paths (patterns) of ours whose presence means the folder holds an
    earlier result. A signature asks for more than one name where one file alone could be the user's
    (a lone ``metrics.csv`` is no evaluation report)."""

    what: str
    writes: tuple[str, ...] = ()
    legacy: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    signature: tuple[tuple[str, ...], ...] = ()

    def recognises(self, unknown: Iterable[str]) -> bool:
        """``unknown`` (paths of a folder without a record) are recognisably this command's output."""
        unknown = [_parts(p) for p in unknown]
        groups = self.signature or tuple((m,) for m in self.markers)
        return any(all(any(_match(u, _parts(pat)) for u in unknown) for pat in group) for group in groups)

    def written_name(self, name: str) -> bool:
        return any(fnmatchcase(name, p) for p in self.writes)

    def legacy_file(self, rel: str) -> bool:
        return any(_match(_parts(rel), _parts(p)) for p in self.legacy)

    def legacy_folder(self, rel: str) -> bool:
        return any(_on_the_way(_parts(rel), _parts(p)) for p in self.legacy)

    def marker(self, rel: str) -> bool:
        return any(_match(_parts(rel), _parts(p)) for p in self.markers)

    def under(self, prefix: str) -> "Layout":
        """This layout for a folder that lies at ``prefix`` inside another output."""
        add = lambda ps: tuple(f"{prefix}/{p}" for p in ps)  # noqa: E731
        return Layout(self.what, (prefix,), add(self.legacy), add(self.markers),
                      tuple(add(group) for group in self.signature))


EVERYTHING = Layout("anything", ("*",), ("**",))  # internal replacements: whatever is there and not the user's


# ---- the folder as it is ---------------------------------------------------------------------------
def scan(folder: str | Path, under: Iterable[str] | None = None) -> dict[str, str]:
    """Everything below ``folder`` (only at and below the relative paths ``under`` when given):
    relative path -> ``"f"`` (file), ``"l"`` (link, never followed) or ``"d"`` (folder). The record
    and the lock at the top are left out; a path of ``under`` whose parent is a link is not looked at."""
    found: dict[str, str] = {}
    stack = []
    if under is None:
        stack.append(("", str(folder)))
    else:
        root = _real(folder)
        for rel in under:
            rel = rel.strip("/")
            path = os.path.join(folder, rel)
            if not rel or _own_name(rel) or not _inside(_real(os.path.dirname(path)), root):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                found[rel] = "l"
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = "d"
                stack.append((rel + "/", path))
            else:
                found[rel] = "f"
    while stack:
        rel, path = stack.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:  # not a folder, gone, unreadable
            continue
        for e in entries:
            r = rel + e.name
            if not rel and _own_name(e.name):
                continue
            try:
                if e.is_symlink():
                    found[r] = "l"
                elif e.is_dir(follow_symlinks=False):
                    found[r] = "d"
                    stack.append((r + "/", e.path))
                else:
                    found[r] = "f"
            except OSError:
                found[r] = "f"
    return found


def read_record(folder: str | Path) -> dict | None:
    """The folder's record (``written``, ``unknown``); None when it has none (or an unreadable one)."""
    path = Path(folder) / RECORD_NAME
    if path.is_symlink() or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("written"), list):
        return None
    return {"written": {str(p) for p in data["written"]}, "unknown": {str(p) for p in data.get("unknown") or []}}


def _write_record(folder: Path, written: set[str], unknown: set[str]) -> None:
    body = json.dumps({"format": FORMAT, "written": sorted(written), "unknown": sorted(unknown)}, indent=0,
                      ensure_ascii=False)
    tmp = folder / f"{RECORD_NAME}.{os.getpid()}.tmp"
    try:
        tmp.write_text(body + "\n", encoding="utf-8")
        os.replace(tmp, folder / RECORD_NAME)  # replaces a link there, never writes through it
    except OSError:  # a full or read-only disk: what went unrecorded stays the user's (never removed)
        try:
            os.unlink(tmp)
        except OSError:
            pass


# ---- sessions: what a held folder held when it was taken ------------------------------------------
@dataclass
class _Session:
    folder: Path
    real: str
    written: set[str]
    unknown: set[str]
    start: set[str]
    had_record: bool


_SESSIONS: dict[str, _Session] = {}


def _real(path: str | Path) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _mtime_ns(path: str) -> int:
    try:
        return os.lstat(path).st_mtime_ns
    except OSError:
        return 0


def begin(folder: str | Path, stale_since_ns: int | None = None) -> None:
    """Start the session of ``folder`` (just locked by this process). ``stale_since_ns``: the start of
    the session of a holder that died with the lock held: what it made is credited to it first."""
    folder = Path(folder)
    rec = read_record(folder)
    present = scan(folder)
    written = set(rec["written"]) & present.keys() if rec else set()
    unknown = set(rec["unknown"]) & present.keys() if rec else set()
    late = set()
    if stale_since_ns is not None:
        late = {p for p in present if p not in written and p not in unknown
                and _mtime_ns(os.path.join(folder, p)) >= stale_since_ns}
    if rec is None:
        unknown = set(present) - late
    written |= late
    session = _Session(folder, _real(folder), written, unknown, set(present), rec is not None)
    if late:  # recorded at once: if this command dies too, its own start time is later
        _write_record(folder, written, unknown)
        session.had_record = True
    _SESSIONS[session.real] = session


def finish(folder: str | Path) -> None:
    """End the session of ``folder``: what is new since it began goes into the record."""
    session = _SESSIONS.pop(_real(folder), None)
    if session is None:
        return
    try:
        present = scan(session.folder)
    except OSError:
        return
    written = {p for p in present if p in session.written or p not in session.start}
    unknown = session.unknown & present.keys()
    if not session.had_record and not written:
        return  # nothing written: a refused command leaves the folder as it was
    if not present:  # emptied (a failed start removed what it wrote): no record of nothing
        try:
            os.unlink(session.folder / RECORD_NAME)
        except OSError:
            pass
        return
    old = read_record(session.folder) if session.had_record else None
    if old is not None and old["written"] == written and old["unknown"] == unknown:
        return
    _write_record(session.folder, written, unknown)


def session_of(path: str | Path) -> _Session | None:
    """The innermost folder this process holds that ``path`` lies in (its session), or None."""
    real = os.path.join(_real(Path(path).parent), Path(path).name)
    best = None
    for key, session in _SESSIONS.items():
        if _inside(real, key) and (best is None or len(key) > len(best.real)):
            best = session
    return best


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
    session = _SESSIONS.get(_real(folder))
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
        sub_session = _SESSIONS.get(_real(folder / sub))
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

    root = _real(folder)
    removed, kept = [], []
    for rel, kind in sorted(inv.entries.items()):
        if kind == "d" or not in_scope(rel) or _own_name(rel.rsplit("/", 1)[-1]):
            continue  # a sub-folder's record goes with its folder (below), its lock never
        path = os.path.join(folder, rel)
        if rel not in inv.ours or not _inside(_real(os.path.dirname(path)), root):
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
        if not _inside(_real(os.path.dirname(path)), root):
            continue
        try:
            if os.listdir(path) == [RECORD_NAME] and not os.path.islink(os.path.join(path, RECORD_NAME)):
                os.unlink(os.path.join(path, RECORD_NAME))  # the record of a folder now empty
                removed.append(f"{rel}/{RECORD_NAME}")
            os.rmdir(path)  # only when empty: a file of the user's keeps its folder; a link is no folder
        except OSError:
            continue
        removed.append(rel + "/")
    session = _SESSIONS.get(_real(folder))
    if session is not None and removed:
        gone = {r.rstrip("/") for r in removed}
        session.start -= gone
        session.written -= gone
        session.unknown -= gone
    elif removed:  # outside a session (a Python caller without the lock): keep the record true
        rec = read_record(folder)
        if rec is not None:
            gone = {r.rstrip("/") for r in removed}
            _write_record(folder, rec["written"] - gone, rec["unknown"] - gone)
    return Removal(removed, kept)


def discard(path: str | Path) -> Removal:
    """Remove ``path`` (a file or folder this command or an earlier one of gsdistill wrote: a checkpoint
    replaced or pruned, a staging folder, a split's labels made again) by :func:`remove_written` in the
    folder this process holds around it (else in its parent folder): links are removed, never
    followed; files of the user's inside stay (and are returned as kept)."""
    path = Path(path)
    session = session_of(path)
    root = session.folder if session is not None else path.parent
    real = os.path.join(_real(path.parent), path.name)
    rel = os.path.relpath(real, _real(root))
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
