"""Import a script under ``tools/`` (not a package) as a module, for tests of its functions; ``filename`` is
its path under ``tools/``, e.g. ``probes/probe_dino_targets.py``."""
from __future__ import annotations

import importlib.util
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(filename: str):
    spec = importlib.util.spec_from_file_location(Path(filename).stem, TOOLS / filename)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
