"""Bad input: ``DataError`` (a clear message naming the file) and ``SkipLog`` (recorded skips).

Builders raise ``DataError`` for an input they cannot use at all; folder-level drivers catch it and
record the skip. Parts of an input that are unusable (a blank page, an unknown class) go into the
``SkipLog`` handed to the builder; ``write_shards`` copies that log into the shard manifest.
"""
from __future__ import annotations

import logging
from collections import Counter

from gsdistill.errors import GsdistillError

log = logging.getLogger("gsdistill.tuples")


class DataError(GsdistillError, ValueError):
    """An input file that cannot be turned into page tuples; the message names the file and why."""


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
