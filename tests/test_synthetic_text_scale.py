"""`text_scale` of the synthetic generator: every font, margin and gap scales with it (large print)."""
from __future__ import annotations

import numpy as np
import pytest

from gsdistill.tuples.sources.synthetic import generate_pages


def _page_header_height(pages) -> float:
    # one line of the smallest font: its box height is the font's ascent + descent
    return float(np.median([s["bbox"][3] - s["bbox"][1] for p in pages for s in p["spans"]
                            if s["category"] == "Page-header"]))


def test_text_scale_two_doubles_line_heights_and_thins_the_page():
    small = list(generate_pages(16, seed=5, width=512, height=640))
    large = list(generate_pages(16, seed=5, width=512, height=640, text_scale=2.0))
    ratio = _page_header_height(large) / _page_header_height(small)
    assert 1.7 <= ratio <= 2.3, ratio  # font sizes are rounded to whole pixels
    assert sum(len(p["boxes"]) for p in large) < 0.6 * sum(len(p["boxes"]) for p in small)
    assert all(0 <= b["bbox"][0] <= b["bbox"][2] <= 512 and 0 <= b["bbox"][1] <= b["bbox"][3] <= 640
               for p in large for b in p["boxes"])


def test_text_scale_one_is_the_default_page():
    a = next(generate_pages(1, seed=5, width=512, height=640))
    b = next(generate_pages(1, seed=5, width=512, height=640, text_scale=1.0))
    assert a["boxes"] == b["boxes"] and np.array_equal(np.asarray(a["image"]), np.asarray(b["image"]))


@pytest.mark.parametrize("bad", [0.2, 5.0])
def test_text_scale_out_of_range_is_an_error(bad):
    with pytest.raises(ValueError, match=f"text_scale must be in \\[0.5, 4\\], got {bad}"):
        next(generate_pages(1, text_scale=bad))
