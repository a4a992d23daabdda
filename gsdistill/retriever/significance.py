"""Paired comparison of two retrievers over the same queries: mean difference and a paired
bootstrap confidence interval (Efron & Tibshirani 1993; Sakai 2006 for IR evaluation).

Each query contributes one paired difference ``d_q = metric_A(q) - metric_B(q)`` (averaged over a
method's seeds first, so a query is one unit, not one per seed); queries are resampled with
replacement ``n_boot`` times and the interval is the percentile interval of the resampled means.
"""
from __future__ import annotations

import numpy as np


def paired_differences(runs: list[dict[str, float]], baseline: dict[str, float]) -> dict[str, float]:
    """``{qid: mean over runs of run[qid] - baseline[qid]}`` over the queries every run scored."""
    common = set(baseline)
    for r in runs:
        common &= set(r)
    return {q: float(np.mean([r[q] - baseline[q] for r in runs])) for q in sorted(common)}


def paired_bootstrap(diffs: list[float], n_boot: int = 10_000, level: float = 0.95, seed: int = 0
                     ) -> tuple[float, float, float]:
    """``(mean, low, high)`` of the mean paired difference with a percentile bootstrap interval."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        raise ValueError("paired bootstrap needs at least one paired difference")
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(d.mean()), float(low), float(high)
