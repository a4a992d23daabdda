"""Per-step schedules: learning rate (linear warm-up, then cosine or linear decay) and teacher EMA
momentum (cosine). Pure functions of the step, so a resumed run continues them exactly."""
from __future__ import annotations

import math


def cosine_with_warmup(step: int, total_steps: int, peak: float, floor: float = 0.0,
                       warmup_steps: int = 0) -> float:
    """``peak * (step+1)/warmup`` during warm-up, then cosine from ``peak`` down to ``floor`` at the last step."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    span = max(total_steps - 1 - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def teacher_momentum(step: int, total_steps: int, base: float = 0.996, end: float = 0.9995) -> float:
    """Cosine increase ``end - (end - base) * (cos(pi * step / (T-1)) + 1) / 2`` (DINO; Table A2: 0.996 -> 0.9995)."""
    progress = min(step / max(total_steps - 1, 1), 1.0)
    return end - (end - base) * (math.cos(math.pi * progress) + 1.0) / 2.0


def linear_with_warmup(step: int, total_steps: int, peak: float, warmup_steps: int = 0) -> float:
    """``peak * min((step+1)/W, (T-step)/(T-W))`` with ``W = max(1, warmup_steps)``: linear warm-up,
    then linear decay that reaches 0 one step after the last (the text retrievers' schedule)."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    warm = max(1, warmup_steps)
    return peak * min((step + 1) / warm, max(0.0, (total_steps - step) / max(1, total_steps - warm)))
