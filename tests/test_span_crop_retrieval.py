"""Retrieval over span-centred crops: a page found from k of its texts by its best-matching crops."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from gsdistill.eval.span_crop_retrieval import best_crop_sims, span_crop_retrieval, span_crop_windows

N_PAGES, SPANS, DIM = 24, 6, 32
W, H, SPAN_PX, CROP = 200, 160, 40, 20


def _colour(gid: int) -> tuple[int, int, int]:
    return gid % 200, gid // 200, 77


def _boxes():
    # 3 x 2 spans of 30 x 16 px, far apart and away from the edges: a crop's centre pixel is its span's
    return [[30 + 60 * c, 40 + 60 * r, 60 + 60 * c, 56 + 60 * r] for r in range(2) for c in range(3)]


def _pages(seed=0):
    rng = np.random.default_rng(seed)
    table = F.normalize(torch.from_numpy(rng.standard_normal((N_PAGES * SPANS, DIM)).astype(np.float32)), dim=1)
    pages = []
    for p in range(N_PAGES):
        img = np.full((H, W, 3), 255, np.uint8)
        spans = []
        for s, (x0, y0, x1, y1) in enumerate(_boxes()):
            img[y0:y1, x0:x1] = _colour(p * SPANS + s)
            spans.append({"text": f"p{p}s{s}", "bbox": [x0, y0, x1, y1]})
        pages.append({"id": f"p{p:02d}", "doc_id": f"d{p // 3}", "image": Image.fromarray(img), "width": W,
                      "height": H, "spans": spans, "sem_emb": table[p * SPANS:(p + 1) * SPANS].numpy()})
    return pages, table


class CentrePixelModel:
    """A crop's embedding is the text embedding of the span its centre pixel is painted with."""

    def __init__(self, table):
        self.table, self.span_crop_view = table, (SPAN_PX, CROP)

    def embed_pages(self, x):
        mean = torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
        rgb = ((x * std + mean) * 255).round().long()[:, :, CROP // 2, CROP // 2]
        return self.table[rgb[:, 0] + 200 * rgb[:, 1]]

    def embed_text_sem(self, t):
        return t

    def to(self, device):
        return self

    def eval(self):
        return self


def test_each_crop_is_centred_on_its_span_and_inside_the_page():
    page = {"width": W, "height": H, "spans": [{"bbox": b} for b in _boxes()] + [{"bbox": [190, 150, 199, 159]}]}
    windows = span_crop_windows(page, SPAN_PX)
    assert windows[0] == (25, 28, 65, 68)  # span 0's centre (45, 48)
    assert windows[-1] == (W - SPAN_PX, H - SPAN_PX, W, H)  # moved onto the page, not cut
    assert len(span_crop_windows(page, SPAN_PX, max_crops=3)) == 3
    assert span_crop_windows({"width": W, "height": H, "spans": []}, SPAN_PX) == [(80, 60, 120, 100)]


def test_crops_that_show_their_spans_find_every_page_and_shuffled_texts_are_chance():
    pages, table = _pages()
    model = CentrePixelModel(table)
    r = span_crop_retrieval(model, pages, k=3, n_boot=200)
    assert r["acc1"] == 1.0 and r["mrr"] == 1.0 and r["n_pages"] == N_PAGES and r["n_docs"] == N_PAGES // 3
    assert r["crops_per_page"] == SPANS and r["span_px"] == SPAN_PX and r["crop_size"] == CROP
    assert r["ci95"] == [1.0, 1.0] and r["chance"] == pytest.approx(1 / N_PAGES)
    assert span_crop_retrieval(model, pages, k=3, aggregation="lse", n_boot=200)["acc1"] == 1.0
    # every page's texts moved to another page (a derangement): no query finds the page it names
    order = np.roll(np.arange(N_PAGES), 1)
    shuffled = [{**p, "sem_emb": pages[j]["sem_emb"]} for p, j in zip(pages, order)]
    assert span_crop_retrieval(model, shuffled, k=3, n_boot=200)["acc1"] == 0.0
    # a random permutation: about one fixed point in expectation
    perm = np.random.default_rng(1).permutation(N_PAGES)
    rand = span_crop_retrieval(model, [{**p, "sem_emb": pages[j]["sem_emb"]} for p, j in zip(pages, perm)],
                               k=3, n_boot=200)
    assert rand["acc1"] == pytest.approx(np.mean(perm == np.arange(N_PAGES))) and rand["acc1"] < 0.15


def test_best_crop_sims_is_the_max_over_valid_crops_in_any_chunking(monkeypatch):
    import gsdistill.eval.span_crop_retrieval as scr
    g = torch.Generator().manual_seed(0)
    q, crops = torch.randn(4, 3, 8, generator=g), torch.randn(5, 6, 8, generator=g)
    valid = torch.rand(5, 6, generator=g) < 0.6
    valid[:, 0] = True
    want = torch.stack([torch.stack([torch.stack([(q[i, t] @ crops[n, valid[n]].T).max() for n in range(5)])
                                     for t in range(3)]) for i in range(4)])
    torch.testing.assert_close(best_crop_sims(q, crops, valid), want)
    monkeypatch.setattr(scr, "MAX_SIMS", 1)  # one page per chunk
    torch.testing.assert_close(best_crop_sims(q, crops, valid), want)


def test_a_model_without_span_views_needs_the_crop_geometry():
    pages, table = _pages()
    model = CentrePixelModel(table)
    model.span_crop_view = None
    with pytest.raises(ValueError, match="span_px"):
        span_crop_retrieval(model, pages)
    assert span_crop_retrieval(model, pages, k=3, span_px=SPAN_PX, crop_size=CROP, n_boot=50)["acc1"] == 1.0
