"""The project's own error base: an error whose message is meant for the user as it stands.

Every stage raises a subclass of :class:`GsdistillError` for bad input (a config value, a file that
is missing, truncated or of the wrong kind); the ``gsdistill`` command prints its message as one
line and exits with code 2 instead of showing a traceback. The subclasses also derive from the
built-in type a caller would expect (``ValueError``, ``FileNotFoundError``), so code that catches
those keeps working.
"""
from __future__ import annotations


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
