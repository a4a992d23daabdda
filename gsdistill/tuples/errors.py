"""Bad input: ``DataError`` (a clear message naming the file) and ``SkipLog`` (recorded skips).

Builders raise ``DataError`` for an input they cannot use at all; folder-level drivers catch it and
record the skip. Parts of an input that are unusable (a blank page, an unknown class) go into the
``SkipLog`` handed to the builder; ``write_shards`` copies that log into the shard manifest.
"""
from __future__ import annotations

import errno
import logging
from collections import Counter
from contextlib import contextmanager

from gsdistill.errors import GsdistillError

log = logging.getLogger("gsdistill.tuples")


class DataError(GsdistillError, ValueError):
    """An input file that cannot be turned into page tuples; the message names the file and why."""

    def __init__(self, *args):
        # raised in a DataLoader worker (a damaged shard member met while training), it comes back as
        # DataError("Caught DataError in DataLoader worker process 0.\nOriginal Traceback ..."): keep
        # the original one-line message, the worker's traceback tells the user nothing
        if args and isinstance(args[0], str) and args[0].startswith("Caught "):
            raised = f"{type(self).__module__}.{type(self).__qualname__}: "
            if raised in args[0]:
                args = (args[0].rsplit(raised, 1)[1].strip(),) + args[1:]
        super().__init__(*args)


# errors of a disk that is full or of a file over its size limit (ulimit -f, the file system's)
_NO_ROOM = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


@contextmanager
def writing(path, rerun: str = "run the same command again"):
    """Turn an ``OSError`` while writing ``path`` (full disk, file too large, no permission, a file
    where a folder should be) into a ``DataError`` naming ``path``; what was written completely stays
    and is kept when the command is run again."""
    try:
        yield
    except OSError as e:
        what = e.strerror or type(e).__name__
        where = f"{e.filename}" if e.filename and str(e.filename) != str(path) else ""
        hint = f"; free some space (or raise the file size limit) and {rerun}" if e.errno in _NO_ROOM else ""
        raise DataError(f"{path}: cannot write ({what}{': ' + where if where else ''}){hint}") from None


class SkipLog:
    """Every skipped input or part of an input, with its reason. Never a silent drop: each skip is
    also logged at WARNING level when ``echo`` is set (the default for a log the builder made itself)."""

    def __init__(self, echo: bool = False):
        self.items: list[dict] = []
        self.echo = echo

    def add(self, source: str, reason: str) -> None:
        self.items.append({"source": str(source), "reason": reason})
        if self.echo:
            log.warning("skipped %s: %s", source, reason)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def reasons(self) -> Counter:
        return Counter(reason_key(item["reason"]) for item in self.items)


def reason_key(reason: str) -> str:
    """The kind of a skip reason for summaries: the text before the first colon that is not inside
    brackets ("unreadable PDF (EmptyFileError: ...)" -> "unreadable PDF", "no text: ..." -> "no text")."""
    depth = 0
    for i, ch in enumerate(reason):
        depth += ch in "([{"
        depth -= ch in ")]}" and depth > 0
        if ch == ":" and depth == 0:
            return reason[:i].strip()
    return reason.split("(")[0].strip() or reason


def ensure_log(skips: SkipLog | None) -> SkipLog:
    """The caller's log, or a fresh one that echoes every skip as a warning."""
    return skips if skips is not None else SkipLog(echo=True)
