"""The local text term (``objective.local_sem``): which spans a span-centred local view shows, the
head's narrowed positives against hand-computed InfoNCE, the term in the model, and its config checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import gsdistill.views.multicrop as multicrop
from gsdistill.config import ConfigError, load_config
from gsdistill.models.alignment import PageTextAlignment
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.models.local_text import local_positives
from gsdistill.pretrain.config_checks import check_pretrain_config
from gsdistill.pretrain.data_stream import tensor_batch
from gsdistill.views.multicrop import MultiCropViews, collate_pretrain, spans_in_window

W, H = 400, 300
# a 6 x 4 grid of 30 x 10 px spans 60 px apart, and one degenerate span (no area)
BOXES = [[20 + 60 * c, 30 + 60 * r, 50 + 60 * c, 40 + 60 * r] for r in range(4) for c in range(6)] + [[5, 5, 5, 9]]


def _page(pid="doc-p0", n_emb=None):
    spans = [{"text": f"t{i}", "bbox": b} for i, b in enumerate(BOXES)]
    n = len(spans) if n_emb is None else n_emb
    return {"id": pid, "doc_id": "doc", "image": Image.new("RGB", (W, H), "white"), "width": W, "height": H,
            "spans": spans, "boxes": [], "sem_emb": np.ones((n, 4), np.float32), "geom_emb": np.ones((2, 4), np.float32)}


def _centres_inside(window, n):
    x0, y0, x1, y1 = window
    return [i for i, b in enumerate(BOXES[:n]) if b[2] > b[0] and x0 <= (b[0] + b[2]) / 2 < x1
            and y0 <= (b[1] + b[3]) / 2 < y1]


def test_spans_in_window_marks_centres_inside_and_the_chosen_span():
    # window x 0..100, y 0..100: span 0 (centre 35, 35) is in, span 1 (centre 95, 35) too, span 2 (155) is not;
    # span 6 (row 1: centre 35, 95) in; span 24 is degenerate (centre 5, 7) and out
    got = spans_in_window(_page(), (0, 0, 100, 100), len(BOXES))
    assert np.flatnonzero(got).tolist() == [0, 1, 6, 7]
    # a chosen span whose centre is outside (the window was moved onto the page) is still a positive
    got = spans_in_window(_page(), (0, 0, 100, 100), len(BOXES), chosen=13)
    assert np.flatnonzero(got).tolist() == [0, 1, 6, 7, 13]
    # only the first n spans (the rows of sem_emb) are marked; a chosen span beyond them is not
    assert np.flatnonzero(spans_in_window(_page(), (0, 0, 100, 100), 2, chosen=13)).tolist() == [0, 1]


def test_local_span_mask_is_what_each_cut_window_shows(monkeypatch):
    cut = []
    real = multicrop.chosen_span_window

    def record(page, side, rng):
        out = real(page, side, rng)
        cut.append(out)
        return out

    monkeypatch.setattr(multicrop, "chosen_span_window", record)
    views = MultiCropViews(global_size=32, local_size=16, n_global=1, n_local=6, local_mode="spans",
                           local_span_px=70, max_spans=20, color_jitter=0, blur_prob=0)
    pages = [_page("a-p0"), _page("b-p0", n_emb=10)]  # the second page's cache holds its first 10 spans
    samples = [views(p) for p in pages]
    assert len(cut) == 12
    for s, n, windows in zip(samples, (20, 10), (cut[:6], cut[6:])):
        assert len(s["local_span_mask"]) == 6
        for mask, (window, chosen) in zip(s["local_span_mask"], windows):
            expected = set(_centres_inside(window, n)) | ({chosen} if chosen < n else set())
            assert mask.shape == (n,) and set(np.flatnonzero(mask).tolist()) == expected
            assert chosen >= n or mask[chosen]
    batch = collate_pretrain(samples)
    shown = batch["local_span_mask"]
    assert shown.shape == (2, 6, 20) and shown.dtype == torch.bool and not shown[1, :, 10:].any()
    rows = local_positives(shown)  # view-major, as local_crops: row v * B + page
    for v in range(6):
        for i in range(2):
            np.testing.assert_array_equal(rows[v * 2 + i, :len(samples[i]["local_span_mask"][v])].numpy(),
                                          samples[i]["local_span_mask"][v])
    plain = MultiCropViews(global_size=32, local_size=16, n_global=1, n_local=2, max_spans=20)
    assert "local_span_mask" not in plain(_page()) and "local_span_mask" not in collate_pretrain([plain(_page())])


def _head(symmetric=False):
    torch.manual_seed(0)
    return PageTextAlignment(16, 8, proj_dim=8, symmetric=symmetric).double()


def _inputs():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(6, 16, generator=g, dtype=torch.float64)  # 2 local views x 3 pages, view-major
    pages = torch.arange(3).repeat(2)
    text = torch.randn(3, 4, 8, generator=g, dtype=torch.float64)
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    return h, pages, text, valid


@pytest.mark.parametrize("symmetric", [False, True])
def test_all_true_text_positives_is_the_old_forward(symmetric):
    head = _head(symmetric)
    h, pages, text, valid = _inputs()
    old, z_old = head(h, pages, text, valid)
    new, z_new = head(h, pages, text, valid, text_positives=torch.ones(6, 4, dtype=torch.bool))
    assert torch.equal(old, new) and torch.equal(z_old, z_new)


def test_one_hot_text_positives_is_infonce_by_hand_both_ways():
    h, pages, text, valid = _inputs()
    slot = torch.tensor([3, 3, 1, 2, 1, 0])  # the one text each view shows
    one_hot = torch.nn.functional.one_hot(slot, 4).bool()
    for symmetric in (False, True):
        head = _head(symmetric)
        loss, z = head(h, pages, text, valid, text_positives=one_hot)
        t = head.embed_text(text).reshape(12, -1)
        logits = head.logit_scale.scale.double() * z @ t.T
        logits = logits.masked_fill(~valid.reshape(1, 12), float("-inf"))
        rows = [a for a in range(6) if valid[pages[a], slot[a]]]  # view 0 shows a padding slot: left out
        assert rows == [1, 2, 3, 4, 5]
        forward = torch.stack([-torch.log_softmax(logits[a], 0)[pages[a] * 4 + slot[a]] for a in rows]).mean()
        if not symmetric:
            torch.testing.assert_close(loss, forward, rtol=1e-12, atol=1e-12)
            continue
        # each valid text -> the views of its page that show it, among all views
        rev = logits.T.masked_fill(~valid.reshape(12, 1), 0.0)
        back = []
        for i in range(12):
            pos = [a for a in range(6) if pages[a] * 4 + slot[a] == i]
            if valid.reshape(-1)[i] and pos:
                back.append(torch.logsumexp(rev[i], 0) - torch.logsumexp(rev[i, pos], 0))
        torch.testing.assert_close(loss, 0.5 * (forward + torch.stack(back).mean()), rtol=1e-12, atol=1e-12)


TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "views.local_mode=spans", "objective.local_sem=true"]


def _model_and_batch(*extra, pages=4):
    cfg = load_config("pretrain", None, TINY + list(extra))
    torch.manual_seed(0)
    model = GSDistill(cfg)
    batch = tensor_batch(cfg, pages, seed=2)
    n_local, width = int(cfg.views.n_local), batch["sem_emb"].shape[1]
    shown = (torch.rand(pages, n_local, width, generator=torch.Generator().manual_seed(3)) < 0.4) & \
        batch["sem_valid"][:, None, :]
    shown[:, :, 0] = True  # the span each view was drawn around
    batch["local_span_mask"] = shown
    return model, batch


def test_local_sem_term_reaches_backbone_and_head_in_one_local_pass(student_passes):
    model, batch = _model_and_batch()
    terms, calls = student_passes(model, batch)
    assert torch.isfinite(terms["local_sem"]) and terms["local_sem"] > 0
    copies = int(batch["masks"].any(1).sum())  # unmasked copies of the masked global views (align_views unmasked)
    assert calls == [8 + copies, 8]  # one student pass per crop size: the local one serves DINO and local_sem
    params = [model.backbone.blocks[0].attn.qkv.weight, model.align["sem"].head.net.weight,
              model.align["sem"].text_proj.proj.weight]
    grads = torch.autograd.grad(terms["local_sem"], params)
    assert all(g.abs().sum() > 0 for g in grads)


def test_total_weighs_local_sem_by_its_lambda():
    a, batch = _model_and_batch("objective.lambda_local_sem=0.0")
    b, _ = _model_and_batch("objective.lambda_local_sem=0.5")
    ta, tb = a(batch), b(batch)
    torch.testing.assert_close(ta["local_sem"], tb["local_sem"])
    torch.testing.assert_close(tb["total"] - ta["total"], 0.5 * tb["local_sem"])


def test_local_sem_needs_span_views_and_a_semantic_head():
    base = ["objective.local_sem=true"]
    with pytest.raises(ConfigError, match="views.local_mode=spans"):
        check_pretrain_config(load_config("pretrain", None, base + ["views.local_mode=random"]), data=False)
    with pytest.raises(ConfigError, match="semantic head"):
        check_pretrain_config(load_config("pretrain", None, base + ["views.local_mode=spans", "objective.heads=joint"]),
                              data=False)
    check_pretrain_config(load_config("pretrain", None, base + ["views.local_mode=spans"]), data=False)
    with pytest.raises(ValueError, match="local_sem"):
        GSDistill(load_config("pretrain", None, TINY[:-2] + base))
    model, batch = _model_and_batch()
    del batch["local_span_mask"]
    with pytest.raises(KeyError, match="local_span_mask"):
        model(batch)


def test_the_shard_stream_builds_the_views_the_config_names(tmp_path, stream_views_kwargs):
    """local_mode and local_span_px reach the pretraining stream's views (they once did not: runs asking for
    span-centred local views got random ones, and no local view could carry the spans it shows)."""
    from gsdistill.tuples.store.writer import write_shards
    write_shards([{**_page(f"d-p{i}"), "boxes": [{"category": "Text", "bbox": BOXES[0]}]} for i in range(2)],
                 tmp_path, pages_per_shard=2, progress=False)
    seen = stream_views_kwargs(tmp_path, load_config("pretrain", None, TINY + ["views.local_span_px=72"]))
    assert (seen["local_mode"], seen["local_span_px"]) == ("spans", 72)
