"""The package's imports run one way (issue 59): no import circle between two modules of
``gsdistill/``, and no module importing a package that :data:`LAYERS` puts at or above its own.

Imports are read with ``ast`` (nothing is imported), at file level: the ones at the top of a file and
the ones inside functions count alike, ``from . import x`` is resolved, and ``from pkg import mod``
names the module ``pkg.mod``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gsdistill"

# Bottom to top. A module may import its own package, the shared base and any package of a lower
# layer; never a sibling of its layer (siblings stay independent) nor anything above. Top-level
# modules (gsdistill/config.py, ...) are named without the package; "gsdistill" is gsdistill/__init__.py.
SHARED_BASE = ("gsdistill", "errors", "config", "config_schema", "threads", "device", "run_log", "output_folder",
               "output_manifest", "output_removal", "run_history")  # small modules that may import one another (no circle)
LAYERS = [
    SHARED_BASE,
    ("losses",),
    ("tuples",),             # documents -> page tuples -> shards + text cache; data only, no model
    ("views",),
    ("models",),             # box_encoder encodes tuples' box descriptors and label sets
    ("embed", "pretrain"),   # embed: hands the text encoder (models) to tuples' embed stage
    ("detect", "eval"),      # the vision stages on a pretrained backbone
    ("retriever",),          # beside them, above eval: scores with eval's index and metrics
    ("pipelines",),          # demo and ablations: every stage end to end
    ("cli",),                # gsdistill/cli.py: imports each stage by name, when it runs
]

# (importing module, imported module) -> why it may run against LAYERS. Keep it empty: fix the code.
EXCEPTIONS: dict[tuple[str, str], str] = {}

# Within tuples (module names below gsdistill.tuples): the shard writer, the shard reader, the text cache
# and the encoder pool each use only what lies below them ("shards" is the reader's old import path).
NEVER_WITHIN_TUPLES = {
    "store.writer": {"store.reader", "shards", "store.text_cache", "embedding.stage", "embedding.encoder_pool"},
    "store.reader": {"store.text_cache", "embedding.stage", "embedding.encoder_pool"},
    "store.text_cache": {"store.reader", "shards", "store.writer", "embedding.stage", "embedding.encoder_pool"},
    "embedding.encoder_pool": {"store.reader", "shards", "store.writer", "store.text_cache", "embedding.stage"},
}
# Within tuples, by sub-package: the builders and the store stand apart; the build uses both, the embedding
# stage the store. Their shared modules (errors, labels, descriptors, worker_guard) sit at the top of tuples.
NEVER_BETWEEN_TUPLES_PACKAGES = {
    "sources": {"store", "build", "embedding"},
    "store": {"sources", "build", "embedding"},
    "build": {"embedding"},
    "embedding": {"sources", "build"},
}
# Old import paths kept for user code only; gsdistill itself imports the new ones.
TUPLES_REEXPORTS = ("gsdistill.tuples.shards", "gsdistill.tuples.synthetic", "gsdistill.tuples.pdf")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, module: str, known: set[str]) -> dict[str, int]:
    """gsdistill modules ``path`` imports anywhere in the file -> line of the first such import.
    A name that is not a module (``from pkg import func``) counts as its package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def closest(name: str) -> str | None:  # the module a dotted name lies in
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for name in targets:
            target = closest(name) if name.split(".")[0] == "gsdistill" else None
            if target and target != module:
                found[target] = min(found.get(target, node.lineno), node.lineno)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    return {m: imports_of(p, m, set(files)) for m, p in files.items()}


def circles(graph: dict[str, dict]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def cycle_through(component: list[str], graph: dict[str, dict]) -> list[str]:
    """One import cycle from the component's first module back to it (breadth first: the shortest)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                return paths[v] + [start]
            if w in members and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return component


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, package) of a gsdistill module."""
    parts = module.split(".")
    package = parts[1] if len(parts) > 1 else "gsdistill"
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i, package
    raise KeyError(package)


def wrong_way(graph: dict[str, dict[str, int]]) -> list[str]:
    """Every import against LAYERS, as ``module -> imported (line N): why``."""
    bad = []
    for src, targets in sorted(graph.items()):
        (i, pkg) = layer_of(src)
        for dst, line in sorted(targets.items()):
            (j, other) = layer_of(dst)
            if pkg == other or (src, dst) in EXCEPTIONS or (j == i == 0) or j < i:
                continue
            bad.append(f"{src} -> {dst} (line {line}): {other} is {'beside' if j == i else 'above'} {pkg}")
    return bad


# --- the checker itself -----------------------------------------------------------------------------

def test_imports_are_read_inside_functions_and_relative_ones_resolved(tmp_path):
    pkg = tmp_path / "gsdistill"
    (pkg / "tuples").mkdir(parents=True)
    (pkg / "models").mkdir()
    for f in ("__init__.py", "tuples/__init__.py", "tuples/shards.py", "models/__init__.py", "models/text_encoder.py"):
        (pkg / f).write_text("")
    (pkg / "tuples" / "cli.py").write_text(
        "def f():\n    from gsdistill.models.text_encoder import TextEncoder\n    from . import shards\n"
        "from .shards import read_pages\nimport gsdistill.models\n")
    got = import_graph(pkg)["gsdistill.tuples.cli"]
    assert got == {"gsdistill.models.text_encoder": 2, "gsdistill.tuples.shards": 3, "gsdistill.models": 5}
    assert wrong_way({"gsdistill.tuples.cli": got, **{m: {} for m in got}}) == [
        "gsdistill.tuples.cli -> gsdistill.models (line 5): models is above tuples",
        "gsdistill.tuples.cli -> gsdistill.models.text_encoder (line 2): models is above tuples"]


def test_circles_are_found_and_named_as_a_cycle():
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}, "e": {"d": 1}}
    assert circles(graph) == [["a", "b", "c"]] and cycle_through(["a", "b", "c"], graph) == ["a", "b", "c", "a"]
    assert circles({"a": {"b": 1}, "b": {}}) == []


# --- the package ------------------------------------------------------------------------------------

GRAPH = import_graph()


def test_every_package_has_a_layer():
    unplaced = set()
    for module in GRAPH:
        try:
            layer_of(module)
        except KeyError as e:
            unplaced.add(e.args[0])
    assert not unplaced, f"gsdistill packages missing from LAYERS in {__file__}: {sorted(unplaced)}"


def test_no_import_circles():
    found = [f"{' -> '.join(cycle_through(c, GRAPH))} (the circle holds {', '.join(c)})" for c in circles(GRAPH)]
    assert not found, "import circles (give each module one direction):\n" + "\n".join(found)


def test_no_import_runs_against_the_layers():
    bad = wrong_way(GRAPH)
    assert not bad, "imports against LAYERS (move the code down, or hand it in from above):\n" + "\n".join(bad)
    stale = [f"{a} -> {b}" for a, b in EXCEPTIONS if b not in GRAPH.get(a, {})]
    assert not stale, f"EXCEPTIONS lists imports that no longer exist, remove them: {stale}"


@pytest.mark.parametrize("module", sorted(NEVER_WITHIN_TUPLES))
def test_each_tuples_store_module_imports_only_downwards(module):
    names = GRAPH[f"gsdistill.tuples.{module}"]
    wrong = sorted(f for f in NEVER_WITHIN_TUPLES[module] if f"gsdistill.tuples.{f}" in names)
    assert not wrong, f"tuples/{module.replace('.', '/')}.py imports {wrong}"


@pytest.mark.parametrize("package", sorted(NEVER_BETWEEN_TUPLES_PACKAGES))
def test_each_tuples_subpackage_imports_one_way(package):
    prefix = f"gsdistill.tuples.{package}"
    wrong = sorted(f"{src} -> {dst}" for src, targets in GRAPH.items() if src == prefix or src.startswith(prefix + ".")
                   for dst in targets for other in NEVER_BETWEEN_TUPLES_PACKAGES[package]
                   if dst == f"gsdistill.tuples.{other}" or dst.startswith(f"gsdistill.tuples.{other}."))
    assert not wrong, f"tuples/{package}/ imports {', '.join(wrong)}"


def test_gsdistill_imports_no_old_tuples_path():
    wrong = sorted(f"{src} -> {dst}" for src, targets in GRAPH.items() for dst in targets if dst in TUPLES_REEXPORTS)
    assert not wrong, f"import the modules these re-export: {wrong}"


def test_eval_names_the_retriever_config_file_the_retriever_writes():
    # eval lies below retriever, so it spells the file name out instead of importing it
    from gsdistill.eval.model_folder import RETRIEVER_CONFIG
    from gsdistill.retriever.model import CONFIG_NAME
    assert RETRIEVER_CONFIG == CONFIG_NAME
