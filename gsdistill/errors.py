"""The project's own error base: an error whose message is meant for the user as it stands.

Every stage raises a subclass of :class:`GsdistillError` for bad input (a config value, a file that
is missing, truncated or of the wrong kind); the ``gsdistill`` command prints its message as one
line and exits with code 2 instead of showing a traceback. The subclasses also derive from the
built-in type a caller would expect (``ValueError``, ``FileNotFoundError``), so code that catches
those keeps working.
"""
from __future__ import annotations

from contextlib import contextmanager


class GsdistillError(Exception):
    """Bad input, explained in one line that names the file or config key and the problem."""


class MissingFileError(GsdistillError, FileNotFoundError):
    """A file or folder the command needs does not exist."""


class CorruptFileError(GsdistillError, ValueError):
    """A file exists but cannot be read (truncated, not of the expected format)."""


class InputError(GsdistillError, ValueError):
    """Any other unusable input (a checkpoint that does not fit the config, a batch with NaN, ...)."""


class TrainingDiverged(GsdistillError, RuntimeError):
    """Training stopped before a bad update or checkpoint: a NaN/inf loss or exploded weights. The
    message names the step and the last good checkpoint."""


class TrainingInterrupted(RuntimeError):
    """SIGINT/SIGTERM: a checkpoint was written and the run stopped."""


def run_training_command(prog: str, run) -> int:
    """``run()``'s exit code; a training stop is one line on stderr instead of a traceback: a
    divergence exits 1, a signal (checkpoint written) 130. Shared by the training commands. Once
    stopped by a signal (or Ctrl-C outside the training loop) the command ignores further ones: a
    second Ctrl-C while it exits would raise KeyboardInterrupt out of a closing progress bar."""
    import sys
    try:
        return run()
    except TrainingDiverged as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:
        _ignore_signals()
        print(f"{prog}: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        _ignore_signals()
        print(f"{prog}: interrupted; every checkpoint written so far is whole (each is written completely or "
              "not at all)", file=sys.stderr)
        return 130


def _ignore_signals() -> None:
    import signal
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass


def corrupt(path, exc: BaseException, what: str = "") -> CorruptFileError:
    """``CorruptFileError`` naming ``path`` and the library's own one-line reason."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    kind = f" {what}" if what else ""
    return CorruptFileError(f"{path}: unreadable{kind} file, truncated or corrupt ({type(exc).__name__}: {reason})")


class OutputWriteError(GsdistillError, OSError):
    """A file could not be written for want of room (a full disk, a quota, the file size limit): the
    message names the file and the free space; what was written completely before stays as it was."""


_NO_ROOM_ERRNOS = {28: "No space left on device", 27: "File too large", 122: "Disk quota exceeded"}


def _free_space(path) -> str:
    import shutil
    from pathlib import Path
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "unknown space"
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if free < 1000 or unit == "TB":
            return f"{free:.0f} {unit}" if unit == "bytes" else f"{free:.1f} {unit}"
        free /= 1000
    return f"{free:.1f} TB"


def _size_limit() -> int | None:
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def no_room(exc: BaseException, path) -> str | None:
    """Why ``exc``, raised while writing ``path``, is a lack of room, in words; None when it is not.
    Libraries hide the errno in their own errors (safetensors: "I/O error: File too large (os error 27)";
    torch.save's zip writer: "unexpected pos"), so their text is read, and the file's size is compared
    with the file size limit (``ulimit -f``)."""
    import os
    import re
    if isinstance(exc, OSError) and exc.errno in _NO_ROOM_ERRNOS:
        return _NO_ROOM_ERRNOS[exc.errno]
    found = re.search(r"os error (28|27|122)\b", str(exc))
    if found:
        return _NO_ROOM_ERRNOS[int(found.group(1))]
    for text in _NO_ROOM_ERRNOS.values():
        if text.lower() in str(exc).lower():
            return text
    limit = _size_limit()
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    if limit is not None and size >= limit - 65536:  # the kernel stops a write at the limit
        return _NO_ROOM_ERRNOS[27]
    return None


def no_room_error(path, why: str, rerun: str = "run the same command again") -> OutputWriteError:
    limit = _size_limit()
    limit_text = f", file size limit {limit} bytes (ulimit -f)" if limit is not None else ""
    return OutputWriteError(f"{path}: cannot write ({why}): {_free_space(path)} free on its disk{limit_text}; "
                            f"free some space (or raise the file size limit) and {rerun}")


@contextmanager
def writing_file(path, cleanup=None, rerun: str = "run the same command again"):
    """``with writing_file(path): <write path>``: a lack of room while writing (any library's error that
    :func:`no_room` recognises) becomes :class:`OutputWriteError` naming ``path`` and the free space
    (one line, exit 2 at the CLI), after ``cleanup(path)`` removes the partial output where given.
    Other errors pass unchanged."""
    try:
        yield path
    except OutputWriteError:
        raise
    except Exception as e:
        why = no_room(e, path)
        if why is None:
            raise
        if cleanup is not None:
            cleanup(path)
        raise no_room_error(path, why, rerun) from None
