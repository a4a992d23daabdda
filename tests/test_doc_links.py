"""Every path and link the docs give resolves (issue 59: files moved, no doc left pointing at the old place).

- Markdown links ``[text](path#anchor)`` in README.md, docs/**/*.md (docs/history/ too) and tools/README.md: the
  file exists and the anchor is one of its headings as GitHub spells them (lowercase, punctuation dropped, spaces
  to ``-``, ``-1``, ``-2``, ... for repeats).
- Sections of docs/learning.md and docs/benchmarks.md named by title in a comment or doc (``docs/learning.md,
  "Real documents"``): a heading of that doc or of its notebook files in docs/history/ has the title.
- Paths of the project's own files named in backticks (``tools/...``, ``gsdistill/...``, ``configs/...``,
  ``tests/...``): they exist (a ``*`` or ``{a,b}`` pattern, an ``<name>`` placeholder or a folder of a run's
  output is not a path of the project and is not checked).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "tools" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:tools|gsdistill|configs|tests)/[^`\s]+)")


def slugs(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(doc: Path) -> list[tuple[str, str]]:
    return [(m.group(1), doc.name) for m in LINK.finditer(doc.read_text(encoding="utf-8"))
            if not re.match(r"[a-z]+:", m.group(1))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_anchor_resolves(doc):
    broken = []
    for target, _ in links(doc):
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in slugs(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with that anchor in {file.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_project_path_in_backticks_exists(doc):
    missing = []
    for m in CODE_PATH.finditer(doc.read_text(encoding="utf-8")):
        path = m.group(1).split(":")[0].rstrip(".,;)")
        if any(c in path for c in "*{}<>") or path.endswith("/") and not (ROOT / path).is_dir():
            continue
        if not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {sorted(set(missing))}"


NAMED_SECTION = re.compile(r"docs/(learning|benchmarks)\.md[,:]? \(?\"([^\"]+)\"")


def test_every_section_named_by_title_is_found():
    """A comment or doc that names a section of the two notebooks (``docs/learning.md, "Real documents"``) finds it:
    a heading of that doc or of its files in docs/history/, which the doc's index links (issue 65 moved them there)."""
    sources = [ROOT / "README.md", ROOT / "tools" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("gsdistill", "configs", "tools", "tests"):
        sources += [p for p in sorted((ROOT / folder).rglob("*")) if p.is_file() and p.suffix in
                    {".py", ".sh", ".yaml", ".yml", ".json", ".md", ".toml"}]
    missing = []
    for src in sources:
        text = re.sub(r"\s*\n\s*(?:#+|//)?\s*", " ", src.read_text(encoding="utf-8", errors="replace"))
        for m in NAMED_SECTION.finditer(text):
            doc, title = m.group(1), m.group(2).replace("...", "").strip().lower()
            files = [ROOT / "docs" / f"{doc}.md", *sorted((ROOT / "docs" / "history").glob(f"{doc}-*.md"))]
            heads = [line.lower() for f in files for line in f.read_text(encoding="utf-8").splitlines()
                     if line.startswith("#")]
            if not any(title in h for h in heads):
                missing.append(f"{src.relative_to(ROOT)}: docs/{doc}.md, \"{m.group(2)}\"")
    assert not missing, "sections named by title that no heading has: " + "; ".join(missing)
