"""Pages and helpers of the views-on-the-device tests (issue 56): the CPU path against the batched path."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from gsdistill.views.batched_views import BatchedViews, encoded_png
from gsdistill.views.collate import page_batch
from gsdistill.views.multicrop import MultiCropViews
from gsdistill.views.render import page_rows, render_views


def drawn_page(seed: int = 7, w: int = 320, h: int = 400) -> dict:
    """A page of drawn rectangles: dark text-like bars (the spans) and two coloured blocks (the boxes); no
    fonts, so its pixels are the same on every machine."""
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 250, np.uint8)
    spans = []
    for _ in range(24):
        x0, y0 = int(rng.integers(8, w - 80)), int(rng.integers(8, h - 12))
        x1, y1 = x0 + int(rng.integers(20, 72)), y0 + int(rng.integers(4, 10))
        img[y0:y1, x0:x1] = rng.integers(0, 60)
        spans.append({"bbox": [x0, y0, x1, y1], "text": "t"})
    boxes = []
    for c in ((200, 40, 40), (40, 90, 200)):
        x0, y0 = int(rng.integers(0, w - 100)), int(rng.integers(0, h - 100))
        img[y0:y0 + 90, x0:x0 + 90] = c
        boxes.append({"bbox": [x0, y0, x0 + 90, y0 + 90], "label": "figure"})
    return {"id": f"drawn-{seed}", "image": Image.fromarray(img), "width": w, "height": h, "spans": spans,
            "boxes": boxes}


def with_embeddings(page: dict, dim: int = 8) -> dict:
    rng = np.random.default_rng(len(page["spans"]))
    return {**page, "sem_emb": rng.standard_normal((len(page["spans"]), dim), dtype=np.float32),
            "geom_emb": rng.standard_normal((len(page["boxes"]), dim), dtype=np.float32)}


def both_paths(page: dict, canvas=None, **kwargs) -> tuple[dict, dict]:
    """(the CPU path's sample, the batched path's sample) of one page, the latter read from PNG bytes as a
    shard stores it."""
    cpu = MultiCropViews(**kwargs)(dict(page))
    batched = BatchedViews(canvas=canvas, **kwargs)({**page, "image": encoded_png(page["image"])})
    return cpu, batched


def rendered(sample: dict, global_size: int, local_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``float32 [V, 3, s, s]`` global and local views of one batched sample, in [0, 255]."""
    rows = page_rows(page_batch([sample]))
    return (render_views(rows, torch.stack(sample["global_params"]), global_size),
            render_views(rows, torch.stack(sample["local_params"]), local_size))


def view_stats(views: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per view: mean grey level, contrast (grey standard deviation) and blur energy (mean squared
    Laplacian of the grey image: what a blur lowers)."""
    grey = (views.float() * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
    lap = torch.nn.functional.conv2d(grey, torch.tensor([[0.0, 1, 0], [1, -4, 1], [0, 1, 0]]).view(1, 1, 3, 3))
    return {"mean": grey.mean((1, 2, 3)), "contrast": grey.std((1, 2, 3)), "blur_energy": lap.pow(2).mean((1, 2, 3))}
