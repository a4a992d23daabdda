"""Output folders a command writes into: checked against its inputs, locked against a second writer.

Every command that writes a folder (a shard build, a split, a pretraining or retriever run, a
detection project, an evaluation report) calls :func:`check_output_dir` before it reads anything
and holds :func:`lock_folder` while it writes, so that

* an output that is a file, that *is* one of the command's inputs, lies inside one or holds one,
  or is given twice (``--train-out x --eval-out x``) is refused before a byte is written;
* two processes never write one folder: the second is refused with the holder's PID. The lock is
  an OS advisory lock (``flock``) on ``FOLDER/.gsdistill.lock``: the kernel drops it when its
  process dies, however it dies, so a stale lock file of a killed run is simply taken over.
  Where the file system has no ``flock`` (some network mounts), the PID written in the file decides:
  a live process on this host holds the folder, a dead one does not.

* what a command writes while it holds a folder is recorded there (``FOLDER/.gsdistill-files``,
  :mod:`gsdistill.output_manifest`), and :func:`check_claim` decides with that record what a folder
  holds: an earlier result of gsdistill's (refused unless ``--overwrite``), files gsdistill did not
  write (refused unless ``--overwrite``, then kept), or a file of the user's at a name the command
  writes (refused always). :func:`remove_earlier` is what ``--overwrite`` removes, and all it removes;
* a folder that cannot be created is one line naming it, and folders a failed command made are
  removed again when it leaves them empty.

Refusals are :class:`~gsdistill.errors.GsdistillError` subclasses: one line naming the folder,
exit code 2 from the ``gsdistill`` command, and a sentence saying what to do instead.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from gsdistill import output_manifest
from gsdistill.errors import GsdistillError
from gsdistill.output_manifest import LOCK_NAME, Layout
from gsdistill.output_removal import Inventory, Removal, describe, inventory, remove_written


class OutputConflict(GsdistillError, ValueError):
    """An output folder that would destroy or mix with an input or an earlier result."""


class FolderBusy(GsdistillError, RuntimeError):
    """Another live process is writing the folder."""


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _inside(a: Path, b: Path) -> bool:
    """``a`` is ``b`` or lies below it (both resolved)."""
    return a == b or b in a.parents


def check_output_dir(out: str | Path, what: str, inputs: Iterable[tuple[str, str | Path]] = (),
                     outputs: Iterable[tuple[str, str | Path]] = ()) -> Path:
    """``out`` (as given) once it is safe to write: not a file, not one of ``inputs`` (``(label,
    path)`` pairs: the folders or files the command reads), not inside one nor holding one, and not
    the same folder as, inside or around another of the command's ``outputs``. ``what`` names the
    option (``--out``) in the message."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputConflict(f"{what} {out}: is a file, not a folder; give a folder path")
    for parent in _real(out).parents:  # a file where a parent folder should be
        if parent.exists() and not parent.is_dir():
            raise OutputConflict(f"{what} {out}: {parent} is a file, not a folder; give a path inside a folder")
    real = _real(out)
    for label, path in inputs:
        src = _real(path)
        if _inside(real, src) and (src.is_dir() or real == src):
            raise OutputConflict(f"{what} {out}: is {'the' if real == src else 'inside the'} input {label} {path}; "
                                 "writing there would destroy what it reads: give a new folder")
        if _inside(src, real):
            raise OutputConflict(f"{what} {out}: holds the input {label} {path}; writing there would "
                                 "destroy what it reads: give a folder outside it")
    for label, path in outputs:
        other = _real(path)
        if _inside(real, other) or _inside(other, real):
            raise OutputConflict(f"{what} {out}: {'is the same folder as' if real == other else 'overlaps'} "
                                 f"{label} {path}; each output needs its own folder")
    return out


def check_claim(folder: str | Path, what: str, layout: Layout, overwrite: bool, fresh: bool = True,
                flag: str | None = "--overwrite") -> Inventory:
    """What ``folder`` holds (:func:`gsdistill.output_removal.inventory`), once a command writing
    ``layout`` there may go on, before it writes or removes anything:

    * a top-level entry the command writes that gsdistill did not write (the user's ``config.yaml``,
      a link where ``units/`` goes, a folder of the user's where ``data/`` goes) is refused, with or
      without ``overwrite``: it would be written over, or written through;
    * when ``fresh`` (the folder is not the command's own earlier output being resumed or redone),
      a folder holding any file gsdistill did not write is refused unless ``overwrite`` (those files
      then stay as they are). ``flag`` names the option in the message (None: the command has none)."""
    folder = Path(folder)
    inv = inventory(folder, layout)
    clashes = inv.clashes(layout)
    if clashes:
        name = clashes[0]
        kind = {"l": "a link", "d": "a folder gsdistill did not make"}.get(inv.entries[name.rstrip("/")],
                                                                           "a file gsdistill did not write")
        raise OutputConflict(f"{what} {folder}: {name} there is {kind}, and {layout.what} writes "
                             f"{name.rstrip('/')}; move it or choose another folder (it is never written over, "
                             "followed or removed, --overwrite or not)")
    if fresh and inv.foreign and not overwrite:
        hint = f", or pass {flag} to write there anyway (they stay as they are)" if flag else ""
        raise OutputConflict(f"{what} {folder}: holds files gsdistill did not write ({describe(inv.foreign)}); "
                             f"give a new or empty folder{hint}")
    return inv


def remove_earlier(folder: str | Path, layout: Layout, under: Iterable[str] | None = None,
                   say: str | None = "--overwrite") -> Removal:
    """Remove what gsdistill wrote in ``folder`` (:func:`gsdistill.output_removal.remove_written`),
    said in one line on stderr (``say``: what asked for it; None says nothing): what went, and the
    files kept because gsdistill did not write them."""
    folder = Path(folder)
    removal = remove_written(folder, layout, under)
    if say and (removal.removed or removal.kept):
        line = f"{say}: removed {describe(removal.removed) or 'nothing'} from {folder}"
        if removal.kept:
            line += (f"; kept {len(removal.kept)} file{'s' if len(removal.kept) != 1 else ''} gsdistill did not "
                     f"write ({describe(removal.kept)})")
        print(line, file=sys.stderr, flush=True)
    return removal


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _describe(info: dict) -> str:
    who = f"PID {info.get('pid', '?')}"
    if info.get("host") and info["host"] != socket.gethostname():
        who += f" on {info['host']}"
    cmd = f" ({info['command']}" + (f", since {info['since']}" if info.get("since") else "") + ")" if info.get("command") else ""
    return who + cmd


def _busy(folder: Path, lock: Path) -> FolderBusy:
    return FolderBusy(f"{folder}: in use by {_describe(_holder(lock))}; wait for it to finish, stop it, "
                      f"or write to another folder (a lock of a process that has died is taken over)")


def _identity() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "session_since_ns": time.time_ns(),
            "command": " ".join(["gsdistill" if i == 0 and a.endswith(("gsdistill", "cli.py", "__main__.py")) else a
                                 for i, a in enumerate(sys.argv[:6])])[:200]}


@contextmanager
def lock_folder(folder: str | Path, record: bool = True) -> Iterator[Path]:
    """Hold ``folder`` (created if missing) for this process; :class:`FolderBusy` naming the holder's
    PID when another live process holds it. Re-entrant within one process (a stage calling another
    on the same folder).

    While held, what the block writes there is recorded (``record``; :mod:`gsdistill.output_manifest`):
    it is what a later ``--overwrite`` may remove, and all it may remove. A folder that cannot be made
    is one line naming it (:class:`OutputConflict`); folders this call made are removed again when
    the block fails and leaves them empty (a refused or failed command leaves no empty folder)."""
    folder = Path(folder)
    key = str(_real(folder))
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield folder
        finally:
            _HELD[key] -= 1
        return
    made = _make(folder)
    path = folder / LOCK_NAME
    try:
        fd, stale = _acquire(folder, path)
    except BaseException:
        _remove_if_empty(made)
        raise
    _HELD[key] = 1
    failed = False
    try:
        if record:
            output_manifest.begin(folder, stale)
        yield folder
    except BaseException:
        failed = True
        raise
    finally:
        try:
            if record:
                output_manifest.finish(folder)
        finally:
            del _HELD[key]
            _release(fd, path)
            if failed:
                _remove_if_empty(made)


_HELD: dict[str, int] = {}


def _make(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those created (deepest first). A folder that
    cannot be made is one line naming it and why (``--run-dir /proc/x``, a parent that is a file)."""
    missing = []
    probe = Path(os.path.abspath(folder))
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _remove_if_empty([m for m in missing if m.is_dir()])
        raise OutputConflict(f"{folder}: cannot be created ({e.strerror or type(e).__name__}"
                             f"{'' if e.filename in (None, str(folder)) else ': ' + str(e.filename)}); "
                             "give a folder you can write") from None
    if not folder.is_dir():
        raise OutputConflict(f"{folder}: is not a folder; give a folder path")
    return missing


def _remove_if_empty(made: list[Path]) -> None:
    for folder in made:  # deepest first: a parent goes only when the folder in it went
        try:
            folder.rmdir()
        except OSError:
            break


def _open_lock(folder: Path, path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0),
                       0o644)
    except IsADirectoryError:
        raise OutputConflict(f"{folder}: {LOCK_NAME} there is a folder, not gsdistill's lock file; remove it "
                             "(it holds no lock) or write to another folder") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputConflict(f"{folder}: {LOCK_NAME} there is a link, not gsdistill's lock file; remove it "
                                 "(it holds no lock) or write to another folder") from None
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC):
            raise OutputConflict(f"{folder}: cannot write its lock file {LOCK_NAME} ({e.strerror}); give a "
                                 "folder you can write") from None
        raise


def _stale_since(fd: int) -> int | None:
    """The session start a killed holder left in the lock file (see output_manifest), or None."""
    try:
        info = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
        return int(info["session_since_ns"]) if isinstance(info, dict) and "session_since_ns" in info else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _acquire(folder: Path, path: Path) -> tuple[int, int | None]:
    import fcntl
    while True:
        fd = _open_lock(folder, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _busy(folder, path) from None
            return _acquire_by_pid(folder, path)  # no flock on this file system
        try:  # the file we locked may have been removed by a holder releasing it just now
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    stale = _stale_since(fd)  # a holder releasing the lock removes the file: any content is a dead one's
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(_identity()).encode())
    return fd, stale


def _acquire_by_pid(folder: Path, path: Path) -> tuple[int, int | None]:
    info = _holder(path)
    if info.get("pid") and info.get("host") == socket.gethostname() and _pid_alive(int(info["pid"])) \
            and int(info["pid"]) != os.getpid():
        raise _busy(folder, path)
    stale = int(info["session_since_ns"]) if str(info.get("session_since_ns", "")).isdigit() else None
    path.write_text(json.dumps(_identity()))
    return -1, stale


def _release(fd: int, path: Path) -> None:
    try:
        path.unlink()  # while still locked: a waiting writer then re-checks the inode (see _acquire)
    except FileNotFoundError:
        pass
    if fd >= 0:
        os.close(fd)


def holder(folder: str | Path) -> dict | None:
    """Who holds ``folder`` now (``pid``, ``host``, ``command``, ``since``), or None when nobody does."""
    import fcntl
    path = Path(folder) / LOCK_NAME
    if path.is_symlink() or not path.is_file():
        return None
    try:  # only a look: the file (and what a killed holder left in it) stays as it is
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return _holder(path)
        info = _holder(path)  # no flock here: the PID decides
        alive = info.get("pid") and info.get("host") == socket.gethostname() and _pid_alive(int(info["pid"]))
        return info if alive and int(info["pid"]) != os.getpid() else None
    finally:
        os.close(fd)
    return None
