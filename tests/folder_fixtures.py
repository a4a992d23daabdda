"""Helpers of the output-folder tests: a folder's files as bytes, and a second process holding a lock."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def tree(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (relative path -> bytes): equal before and after means untouched."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def hold(folder: Path) -> subprocess.Popen:
    """A second process holding ``folder``'s lock until killed."""
    code = ("import sys, time; from gsdistill.output_folder import lock_folder\n"
            "with lock_folder(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc
