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

from gsdistill.errors import GsdistillError

LOCK_NAME = ".gsdistill.lock"


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
            "command": " ".join(["gsdistill" if i == 0 and a.endswith(("gsdistill", "cli.py", "__main__.py")) else a
                                 for i, a in enumerate(sys.argv[:6])])[:200]}


@contextmanager
def lock_folder(folder: str | Path) -> Iterator[Path]:
    """Hold ``folder`` (created if missing) for this process; :class:`FolderBusy` naming the holder's
    PID when another live process holds it. Re-entrant within one process (a stage calling another
    on the same folder)."""
    folder = Path(folder)
    key = str(_real(folder))
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield folder
        finally:
            _HELD[key] -= 1
        return
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = _acquire(folder, path)
    _HELD[key] = 1
    try:
        yield folder
    finally:
        del _HELD[key]
        _release(fd, path)


_HELD: dict[str, int] = {}


def _acquire(folder: Path, path: Path) -> int:
    import fcntl
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
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
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(_identity()).encode())
    return fd


def _acquire_by_pid(folder: Path, path: Path) -> int:
    info = _holder(path)
    if info.get("pid") and info.get("host") == socket.gethostname() and _pid_alive(int(info["pid"])) \
            and int(info["pid"]) != os.getpid():
        raise _busy(folder, path)
    path.write_text(json.dumps(_identity()))
    return -1


def _release(fd: int, path: Path) -> None:
    try:
        path.unlink()  # while still locked: a waiting writer then re-checks the inode (see _acquire)
    except FileNotFoundError:
        pass
    if fd >= 0:
        os.close(fd)


def holder(folder: str | Path) -> dict | None:
    """Who holds ``folder`` now (``pid``, ``host``, ``command``, ``since``), or None when nobody does."""
    path = Path(folder) / LOCK_NAME
    if not path.is_file():
        return None
    try:
        with lock_folder(folder):
            return None
    except FolderBusy:
        return _holder(path)
