"""Views settings reach MultiCropViews from the pretraining config; crop boxes only when asked for."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from gsdistill.config import load_config
from gsdistill.tuples.store.writer import write_shards
from gsdistill.views.multicrop import MultiCropViews


def _page(i: int) -> dict:
    img = Image.fromarray(np.random.default_rng(i).integers(0, 255, (96, 80, 3), np.uint8))
    return {"id": f"p{i}", "image": img, "width": 80, "height": 96, "doc_id": "d",
            "boxes": [{"category": "Text", "bbox": [4, 4, 60, 30]}],
            "spans": [{"text": "words", "bbox": [4, 4, 60, 30], "category": "Text"}]}


def test_color_jitter_blur_and_hflip_come_from_the_config(tmp_path, stream_views_kwargs):
    write_shards([_page(i) for i in range(4)], tmp_path, pages_per_shard=2, progress=False)
    cfg = load_config("pretrain", None, ["views.hflip=true", "views.color_jitter=0.1", "views.blur_prob=0.3",
                                         "views.global_size=32", "views.local_size=16"])
    seen = stream_views_kwargs(tmp_path, cfg)
    assert (seen["hflip"], seen["color_jitter"], seen["blur_prob"]) == (True, 0.1, 0.3)
    defaults = load_config("pretrain").views
    assert (defaults.hflip, defaults.color_jitter, defaults.blur_prob) == (False, 0.4, 0.1)


def test_views_depend_on_seed_and_page_only_and_skip_boxes_by_default():
    page = _page(1)
    plain = MultiCropViews(global_size=32, local_size=16, n_local=1, seed=3)
    a, b = plain(page), MultiCropViews(global_size=32, local_size=16, n_local=1, seed=3)(_page(1))
    plain(_page(2))  # another page in between changes nothing for page 1
    c = plain(page)
    assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(a["global_crops"], b["global_crops"], c["global_crops"]))
    assert "global_boxes" not in a
    other = MultiCropViews(global_size=32, local_size=16, n_local=1, seed=4)(page)
    assert not torch.equal(a["global_crops"][0], other["global_crops"][0])
    tracked = MultiCropViews(global_size=32, local_size=16, n_local=1, seed=3, track_boxes=True)(page)
    assert len(tracked["global_boxes"]) == 2 and tracked["global_boxes"][0]["bboxes"].shape[1] == 4
