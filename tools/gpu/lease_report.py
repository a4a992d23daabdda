"""The lease's one report: ``lease.json`` (every number, by part) and ``lease.md`` (the same as tables),
both rewritten whenever a part or a stage of one ends, so a sitting cut short keeps what finished."""
from __future__ import annotations

import json
import time
from pathlib import Path

from views_check import verdict  # the met/missed cell of issue 56's check, the same words here


class LeaseReport:
    def __init__(self, out: Path, title: str = ""):
        self.out = out
        self.json_path, self.md_path = out / "lease.json", out / "lease.md"
        if title:  # a new sitting: a report left in the folder by an earlier one is replaced
            self._write({"title": title, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "parts": {}, "targets": []})

    def load(self) -> dict:
        return json.loads(self.json_path.read_text())

    def _write(self, state: dict) -> None:
        self.json_path.write_text(json.dumps(state, indent=1, default=str) + "\n")
        self.md_path.write_text(render(state))

    def part(self, name: str, lines: list[str] | None = None, data: dict | None = None, **status) -> None:
        """Add ``lines`` (markdown) and ``data`` to part ``name``; ``status`` (seconds, budget, state) replaces."""
        state = self.load()
        part = state["parts"].setdefault(name, {"lines": [], "data": {}})
        part["lines"] += lines or []
        part["data"].update(data or {})
        part.update(status)
        self._write(state)

    def target(self, what: str, measured: str, ok: bool | None) -> None:
        """One row of the targets table: ``ok`` None = not measured in this sitting (``measured`` says why)."""
        state = self.load()
        state["targets"] = [t for t in state["targets"] if t["target"] != what]
        state["targets"].append({"target": what, "measured": measured, "met": ok})
        self._write(state)


def render(state: dict) -> str:
    lines = [f"# {state['title']}", "", f"started {state['started']}", ""]
    if state["targets"]:
        lines += ["| target | measured | verdict |", "|---|---|---|"]
        lines += [f"| {t['target']} | {t['measured']} | {'not measured' if t['met'] is None else verdict(t['met'])} |"
                  for t in state["targets"]]
        lines.append("")
    for name, part in state["parts"].items():
        took = f", took {part['seconds']:.0f} s" if "seconds" in part else ""
        budget = f" (budget {part['budget']:.0f} s{took})" if "budget" in part else ""
        lines += [f"## {name}{budget}", "", *part["lines"]]
        if part.get("state"):
            lines += ["", f"**{part['state']}**"]
        lines.append("")
    return "\n".join(lines)
