"""Learning-rate and teacher-momentum schedules against their closed forms."""
from __future__ import annotations

import math

import pytest

from gsdistill.pretrain.schedules import cosine_with_warmup, teacher_momentum


def test_warmup_is_linear_then_cosine_to_floor():
    lrs = [cosine_with_warmup(s, 100, peak=1.0, floor=0.1, warmup_steps=10) for s in range(100)]
    assert lrs[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert lrs[10] == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1)
    mid = 10 + (99 - 10) / 2
    assert cosine_with_warmup(int(mid), 100, 1.0, 0.1, 10) == pytest.approx(
        0.1 + 0.45 * (1 + math.cos(math.pi * (int(mid) - 10) / 89)))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])), "monotone after warm-up"


def test_teacher_momentum_table_a2_endpoints_and_shape():
    assert teacher_momentum(0, 50) == pytest.approx(0.996)
    assert teacher_momentum(49, 50) == pytest.approx(0.9995)
    assert teacher_momentum(24.5, 50) == pytest.approx((0.996 + 0.9995) / 2)
    ms = [teacher_momentum(s, 50) for s in range(50)]
    assert all(a <= b for a, b in zip(ms, ms[1:]))


def test_bad_total_steps():
    with pytest.raises(ValueError, match="total_steps"):
        cosine_with_warmup(0, 0, 1.0)
