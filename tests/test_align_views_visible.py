"""`objective.align_views: visible` (the heads read only the views iBOT left whole, in the same pass) and
the pretraining benchmark's bare compute (every student pass the objective runs), issue 22 row 14."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.models.alignment import PageTextAlignment
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import tensor_batch
from gsdistill.models.vit_encoder import encode_views

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "views.mask_prob=0.5"]


@pytest.mark.parametrize("symmetric", [False, True])
def test_visible_anchors_equal_the_head_on_the_visible_views_alone(symmetric):
    torch.manual_seed(0)
    head = PageTextAlignment(16, 8, proj_dim=8, symmetric=symmetric)
    h = torch.randn(8, 16, requires_grad=True)  # 2 views x 4 pages, view-major
    pages = torch.arange(4).repeat(2)
    text, valid = torch.randn(4, 3, 8), torch.rand(4, 3) < 0.8
    valid[:, 0] = True
    visible = torch.tensor([True, False, True, True, False, False, True, True])
    loss, _ = head(h, pages, text, valid, anchor_valid=visible)
    ref, _ = head(h[visible], pages[visible], text, valid)
    torch.testing.assert_close(loss, ref)
    grad, = torch.autograd.grad(loss, h)
    assert grad[~visible].abs().max() == 0  # a hidden view gets no alignment gradient
    torch.testing.assert_close(grad[visible], torch.autograd.grad(ref, h)[0][visible])


def test_visible_reads_the_masked_pass_only_where_no_mask_fell():
    cfg = load_config("pretrain", None, TINY + ["objective.align_views=visible", "objective.distill=false",
                                                 "objective.koleo=false"])
    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    batch = tensor_batch(cfg, 4, seed=3)
    hidden = batch["masks"].any(1)
    assert hidden.any() and not hidden.all()
    calls = []
    model.backbone.blocks[0].register_forward_hook(lambda m, i, o: calls.append(o.shape[0]))
    out = model(batch)
    assert calls == [8]  # one student pass over the 8 global views: no second, unmasked pass
    h = encode_views(model.backbone, batch["global_crops"], batch["masks"], model.mask_token)[0]
    text, valid = model._texts(batch, "geom")
    pages = torch.arange(4).repeat(2)
    ref, _ = model.align["geom"](h[~hidden], pages[~hidden], text, valid)
    torch.testing.assert_close(out["geom"], ref)


def _bench():
    path = Path(__file__).resolve().parents[1] / "tools" / "bench" / "bench_pretrain.py"
    spec = importlib.util.spec_from_file_location("bench_pretrain", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("align_views", ["unmasked", "visible", "masked"])
def test_bare_compute_runs_every_student_pass_of_the_step(align_views):
    cfg = load_config("pretrain", None, TINY + [f"objective.align_views={align_views}", "model.geom_pool_grid=2"])
    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    batch = tensor_batch(cfg, 4, seed=3)
    rows = []
    model.backbone.blocks[0].register_forward_hook(lambda m, i, o: rows.append(o.shape[0]))
    model(batch)["total"].backward()
    step_rows, rows[:] = sorted(rows), []
    _bench().bare_step(model, batch)
    assert sorted(rows) == step_rows  # the same student passes, each over the same views
    # one student call per crop size; with "unmasked" the global call also takes an unmasked copy of
    # each masked view (the views iBOT left whole serve the alignment heads as they are)
    n_masked = int(batch["masks"].any(dim=1).sum())
    assert 0 < n_masked < batch["masks"].shape[0]  # the batch tests both kinds of view
    copies = n_masked if align_views == "unmasked" else 0
    assert step_rows == sorted([batch["local_crops"].shape[0], batch["global_crops"].shape[0] + copies])
