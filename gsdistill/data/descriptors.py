"""Box-text descriptors and the texts of a page that the frozen text encoder embeds.

A layout box becomes a short string: its class, then its box with coordinates normalised to
0..1000 of the page and rounded, ``"Table 112 430 884 702"`` (x0 y0 x1 y1). This is the
geometric positive ``b_i`` of paper 003 §5.4. Changing the format changes ``DESCRIPTOR_VERSION``,
which invalidates every cached embedding (``gsdistill.data.text_cache``).
"""
from __future__ import annotations

from typing import Sequence

DESCRIPTOR_VERSION = "cls-xyxy1000-v1"
SCALE = 1000


def normalise_bbox(bbox: Sequence[float], width: int, height: int) -> list[int]:
    """Pixels -> integers in 0..1000 of the page, clamped, rounded half to even (Python round)."""
    if width <= 0 or height <= 0:
        raise ValueError(f"page size must be positive, got {width}x{height}")
    x0, y0, x1, y1 = (float(v) for v in bbox)
    out = [x0 / width, y0 / height, x1 / width, y1 / height]
    return [int(round(min(max(v, 0.0), 1.0) * SCALE)) for v in out]


def box_descriptor(category: str, bbox: Sequence[float], width: int, height: int) -> str:
    """``"<Class> x0 y0 x1 y1"`` with coordinates in 0..1000 of the page (see module docstring)."""
    return " ".join([category, *map(str, normalise_bbox(bbox, width, height))])


def span_texts(page: dict, max_spans: int | None = None) -> list[str]:
    """The semantic positives: span texts in reading order (the first ``max_spans``)."""
    spans = page["spans"] if max_spans is None else page["spans"][:max_spans]
    return [s["text"] for s in spans]


def box_texts(page: dict, max_boxes: int | None = None) -> list[str]:
    """The geometric positives: one descriptor per layout box (the first ``max_boxes``)."""
    boxes = page["boxes"] if max_boxes is None else page["boxes"][:max_boxes]
    return [box_descriptor(b["category"], b["bbox"], page["width"], page["height"]) for b in boxes]


def single_positive_texts(page: dict) -> tuple[str, str]:
    """(all spans joined in reading order, that text followed by every box descriptor).

    These are the single-positive baselines of paper 003 Table 2/3: one semantic text per page and
    one joint semantic + geometric text.
    """
    sem = " ".join(span_texts(page))
    joint = " ".join([sem, *box_texts(page)]).strip()
    return sem, joint
