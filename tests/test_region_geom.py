"""The region term (``objective.region_geom``): which patch cells each layout box covers in a global view,
the term against hand-computed InfoNCE, the term in the model (no extra backbone pass), and the stream."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from gsdistill.config import load_config
from gsdistill.models.alignment import PageTextAlignment
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.models.region_text import region_features, region_geom_term
from gsdistill.pretrain.data_stream import tensor_batch
from gsdistill.views.multicrop import MultiCropViews, collate_pretrain
from gsdistill.views.region_pool import region_pool_weights


def test_region_pool_weights_are_each_box_area_share_per_patch_cell():
    boxes = np.array([[0, 0, 16, 16], [8, 0, 24, 16], [8, 8, 24, 24], [0, 0, 32, 32], [1, 1, 2, 2], [0, 0, 9, 9]])
    labels = ["box:0", "box:1", "box:2", "span:3", "box:5", "box:3"]  # a span is no layout box; box 5 >= n_boxes
    got = region_pool_weights(boxes, labels, (2, 2), 16, n_boxes=5)
    want = np.zeros((5, 4), np.float32)
    want[0] = [1, 0, 0, 0]
    want[1] = [0.5, 0.5, 0, 0]
    want[2] = [0.25, 0.25, 0.25, 0.25]
    want[3] = [1, 0, 0, 0]  # box 3's own row (labelled box:3), not the span's
    np.testing.assert_allclose(got, want)  # box 4 is not in the view: a zero row
    # a 2 x 3 grid: row-major cells, a box straddling the first row's three cells by a third each
    np.testing.assert_allclose(region_pool_weights(np.array([[0, 4, 48, 12]]), ["box:0"], (2, 3), 16, 1)[0],
                               [1 / 3, 1 / 3, 1 / 3, 0, 0, 0], rtol=1e-6)


def _page(pid="doc-p0", n_boxes=3):
    boxes = [{"category": "Text", "bbox": [0, 0, 32, 32]}, {"category": "Table", "bbox": [32, 32, 64, 64]},
             {"category": "Title", "bbox": [0, 40, 64, 48]}][:n_boxes]
    return {"id": pid, "doc_id": "doc", "image": Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3),
                                                                                                   dtype=np.uint8)),
            "width": 64, "height": 64, "spans": [{"text": "a", "bbox": [2, 2, 20, 8]}], "boxes": boxes,
            "sem_emb": np.ones((1, 4), np.float32), "geom_emb": np.ones((n_boxes, 4), np.float32)}


def test_views_with_region_boxes_keep_the_pixels_and_pool_each_box_into_its_cells():
    kw = dict(global_size=32, local_size=16, n_global=2, n_local=1, global_scale=(1.0, 1.0), color_jitter=0,
              blur_prob=0, seed=4)
    plain, region = MultiCropViews(**kw)(_page()), MultiCropViews(region_boxes=True, **kw)(_page())
    assert "region_pool" not in plain
    for a, b in zip(plain["global_crops"] + plain["local_crops"], region["global_crops"] + region["local_crops"]):
        assert torch.equal(a, b)
    # scale 1 of a square page is the whole page, halved: 2 x 2 cells of 16 px = page quadrants of 32 px
    for pool in region["region_pool"]:
        np.testing.assert_allclose(pool, [[1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0.5, 0.5]], atol=1e-6)
    batch = collate_pretrain([region, MultiCropViews(region_boxes=True, **kw)(_page("doc-p1", n_boxes=1))])
    pool = batch["region_pool"]
    assert pool.shape == (4, 3, 4)  # view-major [n_global * B, S = geom_emb's padded width, P]
    torch.testing.assert_close(pool[1], torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))  # view 0, page 1
    torch.testing.assert_close(pool[2], torch.from_numpy(region["region_pool"][1]))  # view 1, page 0


def test_region_term_is_infonce_of_each_box_against_every_descriptor():
    torch.manual_seed(0)
    head = PageTextAlignment(6, 5, proj_dim=4).double()
    g = torch.Generator().manual_seed(1)
    n_pages, views, width, cells = 3, 2, 4, 5
    patches = torch.randn(views * n_pages, cells, 6, generator=g, dtype=torch.float64)
    pool = torch.rand(views * n_pages, width, cells, generator=g, dtype=torch.float64)
    pool[0, 2] = 0  # box 2 of page 0 cut away in view 0
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    pool = pool * valid.repeat(views, 1)[..., None]
    pool = pool / pool.sum(-1, keepdim=True).clamp_min(1e-12)
    text = torch.randn(n_pages, width, 5, generator=g, dtype=torch.float64)
    batch = {"region_pool": pool, "geom_emb": text, "geom_valid": valid}
    loss = region_geom_term(head, patches, batch, n_pages, text_width=None)
    z = head.embed_pages(region_features(patches, pool).flatten(0, 1))
    logits = head.logit_scale.scale.double() * z @ head.embed_text(text).reshape(-1, 4).T
    logits = logits.masked_fill(~valid.reshape(1, -1), float("-inf"))
    terms = []
    for row in range(views * n_pages):
        page = row % n_pages
        for box in range(width):
            if valid[page, box] and pool[row, box].sum() > 0:
                terms.append(-torch.log_softmax(logits[row * width + box], 0)[page * width + box])
    assert len(terms) == 2 * 9 - 1
    torch.testing.assert_close(loss, torch.stack(terms).mean(), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda p: region_geom_term(head, p, batch, n_pages, None),
                                    (patches.clone().requires_grad_(),))


TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "objective.region_geom=true"]


def _model_and_batch(*extra):
    cfg = load_config("pretrain", None, TINY + list(extra))
    torch.manual_seed(0)
    return GSDistill(cfg), tensor_batch(cfg, 4, seed=2)


def test_region_term_reaches_the_backbone_without_another_pass(student_passes):
    model, batch = _model_and_batch()
    terms, calls = student_passes(model, batch)
    assert torch.isfinite(terms["region_geom"]) and terms["region_geom"] > 0
    copies = int(batch["masks"].any(1).sum())
    assert calls == [8 + copies, 8]  # the global call (with the unmasked copies) and the local one, as without it
    params = [model.backbone.blocks[0].attn.qkv.weight, model.region_align.head.net.weight,
              model.region_align.text_proj.proj.weight]
    assert all(g.abs().sum() > 0 for g in torch.autograd.grad(terms["region_geom"], params))
    off, _ = _model_and_batch("objective.region_geom=false")
    assert "region_geom" not in off(batch) and not hasattr(off, "region_align")


def test_total_weighs_the_region_term_by_its_lambda_and_a_batch_without_pools_is_an_error():
    a, batch = _model_and_batch("objective.lambda_region_geom=0.0")
    b, _ = _model_and_batch("objective.lambda_region_geom=0.5")
    ta, tb = a(batch), b(batch)
    torch.testing.assert_close(ta["region_geom"], tb["region_geom"])
    torch.testing.assert_close(tb["total"] - ta["total"], 0.5 * tb["region_geom"])
    del batch["region_pool"]
    with pytest.raises(KeyError, match="region_pool"):
        a(batch)


def test_the_shard_stream_pools_the_boxes_when_the_objective_asks(tmp_path, stream_views_kwargs):
    from gsdistill.tuples.store.writer import write_shards
    write_shards([_page(f"d-p{i}") for i in range(2)], tmp_path, pages_per_shard=2, progress=False)
    for flag in (True, False):
        cfg = load_config("pretrain", None, TINY[:-1] + [f"objective.region_geom={str(flag).lower()}"])
        assert stream_views_kwargs(tmp_path, cfg)["region_boxes"] is flag
