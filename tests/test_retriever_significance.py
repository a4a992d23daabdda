"""Paired bootstrap interval of the table (tools/experiments/retriever_table.py)."""
from __future__ import annotations

import numpy as np
import pytest

from gsdistill.retriever.significance import paired_bootstrap, paired_differences


def test_paired_differences_average_seeds_per_query():
    base = {"a": 0.5, "b": 0.2, "c": 0.9}
    runs = [{"a": 0.6, "b": 0.1, "c": 0.9}, {"a": 0.8, "b": 0.3}]  # seed 2 misses c: c is left out
    assert paired_differences(runs, base) == pytest.approx({"a": 0.2, "b": 0.0})


def test_bootstrap_interval_matches_the_normal_approximation():
    rng = np.random.default_rng(1)
    diffs = rng.normal(0.02, 0.05, size=400)
    mean, low, high = paired_bootstrap(diffs.tolist(), n_boot=4000)
    half = 1.96 * diffs.std(ddof=1) / np.sqrt(diffs.size)
    assert mean == pytest.approx(diffs.mean())
    assert low == pytest.approx(mean - half, abs=0.15 * half) and high == pytest.approx(mean + half, abs=0.15 * half)
    assert paired_bootstrap([0.01] * 5) == pytest.approx((0.01, 0.01, 0.01))  # no spread, no width
    assert paired_bootstrap(diffs.tolist(), seed=3) == paired_bootstrap(diffs.tolist(), seed=3)
    with pytest.raises(ValueError, match="at least one"):
        paired_bootstrap([])
