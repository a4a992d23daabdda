"""Span-centred local crops (``views.local_mode: spans``): real text seen near its native size."""
import numpy as np
import pytest
from PIL import Image

from gsdistill.config import ConfigError, load_config
import torch

from gsdistill.models.view_batch import normalize_crops
from gsdistill.views.multicrop import MultiCropViews, span_window
from gsdistill.views.pixels import IMAGENET_MEAN, IMAGENET_STD

W, H, BAR = (600, 800, (300, 400, 360, 410))  # one 60 x 10 px black "text line" on a white page


def _page(pid: str = "doc-p0") -> dict:
    img = np.full((H, W, 3), 255, np.uint8)
    x0, y0, x1, y1 = BAR
    img[y0:y1, x0:x1] = 0
    return {"id": pid, "doc_id": "doc", "image": Image.fromarray(img), "width": W, "height": H,
            "spans": [{"text": "a line", "bbox": list(BAR)}], "boxes": [{"category": "Text", "bbox": list(BAR)}]}


def _grey(view) -> np.ndarray:
    """[3, s, s] uint8 crop -> [s, s] intensities in 0..1."""
    assert view.dtype == torch.uint8  # crops travel as pixels, normalised on the device
    return view.numpy().transpose(1, 2, 0).mean(-1) / 255.0


def test_crops_normalised_on_the_device_as_albumentations_did_in_the_workers():
    import albumentations as A
    pixels = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    expected = A.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)(image=pixels)["image"].transpose(2, 0, 1)
    ours = normalize_crops(torch.from_numpy(pixels.transpose(2, 0, 1).copy())[None])[0]
    assert ours.dtype == torch.float32
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5)
    float_crops = torch.randn(1, 3, 4, 4)
    assert normalize_crops(float_crops) is float_crops  # already normalised (random benchmark batches)


def test_span_window_holds_a_point_of_the_span_and_stays_on_the_page():
    rng = np.random.default_rng(0)
    for _ in range(200):
        x0, y0, x1, y1 = span_window(_page(), 96, rng)
        assert 0 <= x0 < x1 <= W and 0 <= y0 < y1 <= H
        assert x1 - x0 == y1 - y0 and 0.8 * 96 - 1 <= x1 - x0 <= 1.25 * 96 + 1
        # the window overlaps the span (its centre was drawn inside it)
        assert x0 < BAR[2] and x1 > BAR[0] and y0 < BAR[3] and y1 > BAR[1]


def test_span_window_without_spans_is_the_page_centre_and_never_exceeds_the_page():
    page = {**_page(), "spans": [], "width": 50, "height": 40}
    x0, y0, x1, y1 = span_window(page, 96, np.random.default_rng(1))
    assert (x0, y0, x1 - x0, y1 - y0) == (5, 0, 40, 40)


def test_span_crops_show_the_line_at_near_native_height_where_random_crops_lose_it():
    spans = MultiCropViews(global_size=32, local_size=64, n_local=16, local_mode="spans", local_span_px=96,
                           color_jitter=0, blur_prob=0, seed=3)(_page())
    heights = []
    for v in spans["local_crops"]:
        dark_rows = (_grey(v) < 0.5).any(1)
        assert dark_rows.any(), "every span crop must show its span"
        heights.append(int(dark_rows.sum()))
    # 10 px line x 64 / (96 x 0.8..1.25) = 5.3..8.3 px in the view
    assert 5 <= np.median(heights) <= 9
    rand = MultiCropViews(global_size=32, local_size=64, n_local=16, color_jitter=0, blur_prob=0, seed=3)(_page())
    seen = sum(bool((_grey(v) < 0.5).any()) for v in rand["local_crops"])
    assert seen < 16  # DINO's random local crops mostly miss a line that covers 0.1 % of the page


def test_span_views_are_a_function_of_seed_and_page_and_track_boxes():
    make = lambda seed: MultiCropViews(global_size=32, local_size=64, n_local=3, local_mode="spans",  # noqa: E731
                                       seed=seed, track_boxes=True)
    a, b, c = make(5)(_page()), make(5)(_page()), make(6)(_page())
    assert all(np.array_equal(x, y) for x, y in zip(a["local_crops"], b["local_crops"]))
    assert not all(np.array_equal(x, y) for x, y in zip(a["local_crops"], c["local_crops"]))
    for view, boxes in zip(a["local_crops"], a["local_boxes"]):
        assert len(boxes["bboxes"]) == 2 and boxes["labels"] == ["span:0", "box:0"]
        x0, y0, x1, y1 = boxes["bboxes"][0]
        assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64
        inside = _grey(view)[int(y0) + 1:int(y1) - 1, int(x0) + 1:int(x1) - 1]
        assert inside.size == 0 or inside.mean() < 0.5  # the tracked box is where the dark line is


def test_views_from_config_and_strict_mode():
    cfg = load_config("pretrain", None, ["views.local_mode=spans", "views.local_span_px=80"])
    views = MultiCropViews.from_config(cfg.views, patch_size=16, seed=0)
    assert views.local_mode == "spans" and views.local_span_px == 80
    with pytest.raises(ConfigError, match="local_mode"):
        load_config("pretrain", None, ["views.local_mode=span"])
    with pytest.raises(ValueError, match="local_mode"):
        MultiCropViews(local_mode="boxes")
