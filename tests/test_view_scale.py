"""The report's scale of the page in pretraining's views (``demo_report.view_page_scale``) is the scale the
views really have, and its sentence compares it with the detector's input."""
import numpy as np
import pytest
from PIL import Image

from gsdistill.config import load_config
from gsdistill.pipelines.demo_report import scale_against_detector, view_page_scale
from gsdistill.views.multicrop import MultiCropViews

W, H, BOX, STEP = 600, 800, 20, 40  # a page tiled with 20 px boxes every 40 px


def _page(i: int) -> dict:
    boxes = [{"category": "Text", "bbox": [x, y, x + BOX, y + BOX]}
             for x in range(10, W - BOX, STEP) for y in range(10, H - BOX, STEP)]
    return {"id": f"doc-p{i}", "doc_id": "doc", "image": Image.fromarray(np.full((H, W, 3), 255, np.uint8)),
            "width": W, "height": H, "spans": [], "boxes": boxes}


def _measured_factor(size: int, scale: tuple[float, float]) -> float:
    """Median of sqrt(x factor * y factor) of the tracked boxes that the crops left whole."""
    views = MultiCropViews(global_size=size, global_scale=scale, local_size=32, n_local=0, color_jitter=0,
                           blur_prob=0, seed=0, track_boxes=True)
    factors = []
    for i in range(40):
        for b in views(_page(i))["global_boxes"]:
            w, h = (np.array([x1 - x0 for x0, _, x1, _ in b["bboxes"]]), np.array([y1 - y0 for _, y0, _, y1 in b["bboxes"]]))
            x0, y0 = np.array([x for x, *_ in b["bboxes"]]), np.array([y for _, y, *_ in b["bboxes"]])
            whole = (x0 > 0) & (y0 > 0) & (x0 + w < size) & (y0 + h < size)  # not cut by the crop's edge
            factors += list(np.sqrt(w[whole] * h[whole]) / BOX)
    return float(np.median(factors))


@pytest.mark.parametrize("scale", [(0.9, 1.0), (0.08, 0.2), (0.02, 0.06)])
def test_view_page_scale_is_the_scale_the_crops_have(scale):
    predicted = view_page_scale([_page(0)], 112, scale) / max(W, H)
    assert _measured_factor(112, scale) == pytest.approx(predicted, rel=0.05)


def test_span_crops_scale_by_their_page_pixels():
    assert view_page_scale([_page(0)], 64, (0.05, 0.32), span_px=96) == pytest.approx(64 * 800 / 96)


def test_the_sentence_puts_both_views_against_the_detector():
    views = load_config("pretrain", None, ["views.global_size=112", "views.global_scale=[0.9,1.0]",
                                           "views.local_size=64", "views.local_scale=[0.05,0.32]"]).views
    text = scale_against_detector([_page(0)], views, 384)
    whole = 112 * 800 / np.sqrt(0.95 * W * H)
    assert f"show it at about {whole:.0f} px ({whole / 384:.2f}x the detector's scale)" in text
    assert "(64 px, 18 % of the page area)" in text
    assert scale_against_detector([], views, 384) == ""
