"""Kept at this path for ``../shared/gpu/README.md`` (``python3 tools/gpu_check.py`` on a lent GPU machine, and
its ``loop_probe.py``, which imports ``gpu_check`` from ``tools/``): the check itself is ``tools/gpu/gpu_check.py``.
Run, this runs that script with the same arguments; imported, it is that module."""
import importlib.util
import runpy
import sys
from pathlib import Path

_TARGET = Path(__file__).resolve().parent / "gpu" / "gpu_check.py"
sys.path.insert(0, str(_TARGET.parent))  # its own imports (gpu_profile)

if __name__ == "__main__":
    sys.argv[0] = str(_TARGET)
    runpy.run_path(str(_TARGET), run_name="__main__")
else:
    _spec = importlib.util.spec_from_file_location(__name__, _TARGET)
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _module  # `import gpu_check` returns the real module
    _spec.loader.exec_module(_module)
