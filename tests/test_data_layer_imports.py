"""The data layer runs one way: reading shards, writing shards, the text cache and the embedding
stage each import only what lies below them, and nothing in ``gsdistill/tuples`` but the command
(``cli.py``, which wires the encoder in) reaches up into ``gsdistill.models``. Imports inside
functions count: they are parsed, not executed."""
import ast
from pathlib import Path

import pytest

TUPLES = Path(__file__).resolve().parents[1] / "gsdistill" / "tuples"

# module -> modules of gsdistill.tuples it must never import (directly or inside a function)
FORBIDDEN = {
    "shard_writer": {"shards", "text_cache", "embed_stage", "encode_pool"},
    "shards": {"text_cache", "embed_stage", "encode_pool"},
    "text_cache": {"shards", "shard_writer", "embed_stage", "encode_pool"},
    "encode_pool": {"shards", "shard_writer", "text_cache", "embed_stage"},
}


def imported_modules(path: Path) -> set[str]:
    """Every module named by an import statement anywhere in the file (absolute names)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against gsdistill.tuples
                base = "gsdistill.tuples" + (f".{base}" if base else "")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_imported_modules_sees_function_level_and_relative_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from gsdistill.models.text_encoder import TextEncoder\n    from . import shards\n")
    assert {"gsdistill.models.text_encoder", "gsdistill.tuples.shards"} <= imported_modules(src)


@pytest.mark.parametrize("path", sorted(p for p in TUPLES.glob("*.py") if p.name != "cli.py"), ids=lambda p: p.name)
def test_tuples_never_imports_the_models_package(path):
    up = sorted(m for m in imported_modules(path) if m == "gsdistill.models" or m.startswith("gsdistill.models."))
    assert not up, f"{path.name} imports {up}: hand the encoder in instead (see embed_stage.py)"


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_each_data_module_imports_only_downwards(module):
    names = imported_modules(TUPLES / f"{module}.py")
    wrong = sorted(f for f in FORBIDDEN[module] if f"gsdistill.tuples.{f}" in names)
    assert not wrong, f"{module}.py imports {wrong}"
