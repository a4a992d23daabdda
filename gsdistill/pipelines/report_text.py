"""Sentences and paths shared by the demo report's sections: claims that say only what an interval shows."""
from __future__ import annotations

import os
from pathlib import Path


def rel(path: str | Path, out: Path) -> str:
    """``path`` relative to the report's folder ``out``, so the run folder can be moved or zipped whole."""
    return os.path.relpath(Path(path).resolve(), out.resolve())


def claim(label_a: str, label_b: str, diff: float, ci: tuple[float, float], unit: str, digits: int = 1) -> str:
    """``B − A: +x [lo, hi] unit: verdict``: "B higher" only when lo > 0, "A higher" only when hi < 0,
    else no measurable difference. ``diff`` and ``ci`` (a 95 % interval of B − A) are in ``unit``."""
    lo, hi = ci
    if lo > 0:
        verdict = f"{label_b} higher"
    elif hi < 0:
        verdict = f"{label_a} higher"
    else:
        verdict = "no measurable difference (the 95 % interval includes 0)"
    return f"{label_b} − {label_a}: {diff:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}] {unit}: {verdict}"


def chance_claim(label: str, value: float, ci: tuple[float, float], chance: float, unit: str = "%") -> str:
    """``label: x [lo, hi] % vs chance c %: verdict``: above chance only when lo > chance, below when hi < chance."""
    lo, hi = ci
    if lo > chance:
        verdict = "above chance"
    elif hi < chance:
        verdict = "below chance"
    else:
        verdict = "not distinguishable from chance (the 95 % interval includes chance)"
    return f"{label}: {value:.1f} [{lo:.1f}, {hi:.1f}] {unit} vs chance {chance:.1f} {unit}: {verdict}"
