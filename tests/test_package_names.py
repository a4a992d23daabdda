"""No package or module of the project is named like a build-output folder.

GitHub's Python ``.gitignore`` template, many global ignore files, ``.dockerignore`` files and tools
that package or draw a tree treat ``build/``, ``dist/``, ``out/``, ``target/``, ``.cache/`` and
``runs/`` as generated output: a package under such a name is silently lost from a fork's commits.
"""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_NAMES = {"build", "dist", "out", "target", ".cache", "runs"}


def source_paths(top: Path) -> list[Path]:
    return sorted(p for p in top.rglob("*.py") if "__pycache__" not in p.parts)


def offending_components(path: Path, top: Path) -> list[str]:
    """The components of ``path`` (relative to ``top``, a module's stem included) named like output."""
    rel = path.relative_to(top)
    parts = [*rel.parts[:-1], rel.stem]
    return [p for p in parts if p.lower() in OUTPUT_NAMES]


@pytest.mark.parametrize("top", ["gsdistill", "tools", "tests"])
def test_no_package_or_module_is_named_like_build_output(top):
    base = ROOT / top
    bad = {str(p.relative_to(ROOT)): offending_components(p, base) for p in source_paths(base)}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"paths named like build output (renamed to something no tool ignores): {bad}"


def test_the_check_sees_an_output_named_package(tmp_path):
    # the check itself must fail on the case it guards against, at any depth and as a module stem
    for rel in ("pkg/build/driver.py", "pkg/a/dist.py", "pkg/runs/x/y.py", "pkg/.cache/m.py"):
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("")
    found = {str(p.relative_to(tmp_path)) for p in source_paths(tmp_path) if offending_components(p, tmp_path)}
    assert found == {"pkg/build/driver.py", "pkg/a/dist.py", "pkg/runs/x/y.py", "pkg/.cache/m.py"}
    ok = tmp_path / "pkg/builder/driver.py"
    ok.parent.mkdir(parents=True)
    ok.write_text("")
    assert not offending_components(ok, tmp_path)


def test_the_page_builder_package_is_where_the_docs_say():
    assert (ROOT / "gsdistill/tuples/builder/driver.py").is_file()
    assert not (ROOT / "gsdistill/tuples/build").exists()
