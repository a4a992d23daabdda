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

What is whose, and the one way anything is removed: :mod:`gsdistill.output_removal`.
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


def own_name(name: str) -> bool:
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
        root = real_path(folder)
        for rel in under:
            rel = rel.strip("/")
            path = os.path.join(folder, rel)
            if not rel or own_name(rel) or not inside(real_path(os.path.dirname(path)), root):
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
            if not rel and own_name(e.name):
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


def write_record(folder: Path, written: set[str], unknown: set[str]) -> None:
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


def real_path(path: str | Path) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def inside(path: str, root: str) -> bool:
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
    session = _Session(folder, real_path(folder), written, unknown, set(present), rec is not None)
    if late:  # recorded at once: if this command dies too, its own start time is later
        write_record(folder, written, unknown)
        session.had_record = True
    _SESSIONS[session.real] = session


def finish(folder: str | Path) -> None:
    """End the session of ``folder``: what is new since it began goes into the record."""
    session = _SESSIONS.pop(real_path(folder), None)
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
    write_record(session.folder, written, unknown)


def session_of(path: str | Path) -> _Session | None:
    """The innermost folder this process holds that ``path`` lies in (its session), or None."""
    real = os.path.join(real_path(Path(path).parent), Path(path).name)
    best = None
    for key, session in _SESSIONS.items():
        if inside(real, key) and (best is None or len(key) > len(best.real)):
            best = session
    return best


def held(folder: str | Path) -> _Session | None:
    """The session of ``folder`` when this process holds it, else None."""
    return _SESSIONS.get(real_path(folder))
