"""GSDistill model: masked encoding, MPCL / SP terms against reference formulas, ablation configs, EMA, queue."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gsdistill.config import configs_dir, load_config
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.models.vit_encoder import encode_views
from gsdistill.pretrain.data_stream import tensor_batch

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32"]


def tiny(experiment=None, *extra):
    return load_config("pretrain", experiment, TINY + list(extra))


def model_and_batch(experiment=None, *extra, pages=4, seed=0):
    cfg = tiny(experiment, *extra)
    torch.manual_seed(seed)
    return GSDistill(cfg), tensor_batch(cfg, pages, seed=seed), cfg


def test_encode_views_is_timm_pooling_and_masking_hides_content():
    model, batch, _ = model_and_batch()
    x = batch["global_crops"][:2]
    pooled, patches = encode_views(model.backbone, x, with_patches=True)
    torch.testing.assert_close(pooled, model.backbone(x))
    assert patches.shape == (2, 4, model.backbone.embed_dim)
    # change only patch 0 (top-left 16x16): masked -> identical output, unmasked -> different
    y = x.clone()
    y[:, :, :16, :16] += 5.0
    mask = torch.zeros(2, 4, dtype=torch.bool)
    mask[:, 0] = True
    a = encode_views(model.backbone, x, mask, model.mask_token)[0]
    b = encode_views(model.backbone, y, mask, model.mask_token)[0]
    torch.testing.assert_close(a, b)
    assert not torch.allclose(encode_views(model.backbone, y)[0], pooled)


def reference_mpcl(z, texts, valid, page_of_anchor, scale):
    """Per-anchor loop: -log(sum_pos exp(s<z,t>) / sum_valid exp(s<z,t>))."""
    losses = []
    flat, flat_valid = texts.reshape(-1, texts.shape[-1]), valid.reshape(-1)
    owner = torch.arange(texts.shape[0]).repeat_interleave(texts.shape[1])
    for a in range(z.shape[0]):
        logits = scale * flat @ z[a]
        pos = flat_valid & (owner == page_of_anchor[a])
        losses.append(torch.logsumexp(logits[flat_valid], 0) - torch.logsumexp(logits[pos], 0))
    return torch.stack(losses).mean()


def test_mpcl_terms_match_reference_per_anchor_loop():
    model, batch, _ = model_and_batch("mpcl_dual")
    terms = model(batch)
    assert set(terms) == {"sem", "geom", "total"}
    h = encode_views(model.backbone, batch["global_crops"])[0]
    anchors = torch.arange(4).repeat(2)
    for name in ("sem", "geom"):
        head = model.align[name]
        expected = reference_mpcl(head.embed_pages(h), head.embed_text(batch[f"{name}_emb"]),
                                  batch[f"{name}_valid"], anchors, head.logit_scale.scale)
        torch.testing.assert_close(terms[name], expected)
    torch.testing.assert_close(terms["total"], terms["sem"] + terms["geom"])


@pytest.mark.parametrize("experiment,key,head", [("sp_semantic", "sp_sem_emb", "sem"),
                                                 ("sp_joint", "sp_joint_emb", "joint")])
def test_sp_is_clip_infonce_on_concatenated_text(experiment, key, head):
    model, batch, _ = model_and_batch(experiment)
    terms = model(batch)
    assert set(terms) == {head, "total"}
    h = encode_views(model.backbone, batch["global_crops"])[0]
    align = model.align[head]
    logits = align.logit_scale.scale * align.embed_pages(h) @ align.embed_text(batch[key]).T
    expected = F.cross_entropy(logits, torch.arange(4).repeat(2))
    torch.testing.assert_close(terms[head], expected)


ABLATIONS = sorted(p.stem for p in (configs_dir() / "pretrain").glob("*.yaml") if p.stem != "default")


@pytest.mark.parametrize("experiment", ABLATIONS)
def test_every_ablation_config_runs_forward_backward(experiment):
    model, batch, cfg = model_and_batch(experiment, "views.n_local=2")
    o = cfg.objective
    terms = model(batch)
    heads = {"semantic": {"sem"}, "dual": {"sem", "geom"}, "joint": {"joint"}}[o.heads]
    expected = heads | {k for k in ("distill", "ibot", "koleo") if o[k]} | {"total"}
    assert set(terms) == expected
    ramp = 1.0 / model.distill_warmup if model.distill_warmup > 0 else 1.0  # first step of the ramp
    weighted = sum(model.weights[k] * (ramp if k in ("distill", "ibot") else 1.0) * v
                   for k, v in terms.items() if k != "total")
    torch.testing.assert_close(terms["total"], weighted)
    terms["total"].backward()
    grads = [p.grad for _, p in model.student_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), "every student parameter gets a gradient"
    assert all(p.grad is None for p in model.teacher.parameters()) if hasattr(model, "teacher") else True


def test_distill_local_switch_changes_teacher_views():
    torch.manual_seed(0)
    model_gl, batch, _ = model_and_batch("distill_global_local")
    model_g = GSDistill(tiny("distill_global"))
    model_g.load_state_dict(model_gl.state_dict())
    d_gl, d_g = model_gl(batch)["distill"], model_g(batch)["distill"]
    assert not torch.isclose(d_gl, d_g), "teacher on local views adds (student, teacher-local) pairs"
    assert model_gl(batch)["sem"] == model_g(batch)["sem"]


def test_ema_update_formula():
    model, _, _ = model_and_batch()
    with torch.no_grad():
        for _, p in model.student_parameters():
            p.add_(0.1)
    before = [(t.clone(), s.clone()) for t, s in model.teacher_pairs()]
    model.update_teacher(0.9)
    for (t0, s0), (t1, _) in zip(before, model.teacher_pairs()):
        torch.testing.assert_close(t1, 0.9 * t0 + 0.1 * s0)


def test_memory_bank_adds_raw_text_negatives():
    model, batch, _ = model_and_batch("mpcl_semantic", "objective.queue_size=64")
    head = model.align["sem"]
    model.train()
    first = model(batch)["sem"]
    n_valid = int(batch["sem_valid"].sum())
    assert int(head.queue_valid.sum()) == n_valid and int(head.queue_ptr) == n_valid
    torch.testing.assert_close(head.queue[:n_valid], batch["sem_emb"][batch["sem_valid"]])
    second = model(batch)["sem"]
    h = encode_views(model.backbone, batch["global_crops"])[0]
    z = head.embed_pages(h)
    texts = torch.cat([head.embed_text(batch["sem_emb"]).reshape(-1, 32), head.embed_text(head.queue[:n_valid])])
    valid = torch.cat([batch["sem_valid"].reshape(-1), torch.ones(n_valid, dtype=torch.bool)])
    logits = head.logit_scale.scale * z @ texts.T
    own = torch.arange(4).repeat_interleave(batch["sem_valid"].shape[1])
    pos = torch.cat([own, torch.full((n_valid,), -1)])[None, :] == torch.arange(4).repeat(2)[:, None]
    pos &= valid
    expected = (torch.logsumexp(logits.masked_fill(~valid, -math.inf), 1)
                - torch.logsumexp(logits.masked_fill(~pos, -math.inf), 1)).mean()
    torch.testing.assert_close(second, expected)
    assert second > first, "more negatives, higher loss"


def test_inference_api_shapes_and_errors():
    model, batch, _ = model_and_batch()
    model.eval()
    pages = model.embed_pages(batch["global_crops"][:3])
    assert pages.shape == (3, 32)
    torch.testing.assert_close(pages.norm(dim=-1), torch.ones(3))
    assert model.embed_pages_geom(batch["global_crops"][:3]).shape == (3, 32)
    text = model.embed_text_sem(batch["sem_emb"][0])
    torch.testing.assert_close(text.norm(dim=-1), torch.ones(text.shape[0]))
    assert model.text_encoder_name == "all-MiniLM-L6-v2"
    sem_only, _, _ = model_and_batch("mpcl_semantic")
    with pytest.raises(ValueError, match="no 'geom' head"):
        sem_only.embed_pages_geom(batch["global_crops"][:1])
    bad = dict(batch, sem_emb=torch.randn(4, 6, 100))
    with pytest.raises(ValueError, match="model.text_dim"):
        model(bad)


def test_teacher_targets_are_deterministic_under_student_drop_path():
    model, batch, _ = model_and_batch(None, "model.backbone.drop_path_rate=0.5", "model.backbone.depth=2")
    model.train()
    assert model.backbone.training and not model.teacher.training
    glob = batch["global_crops"]
    t1 = encode_views(model.teacher["backbone"], glob)[0]
    t2 = encode_views(model.teacher["backbone"], glob)[0]
    torch.testing.assert_close(t1, t2)
    assert not torch.equal(encode_views(model.backbone, glob)[0], encode_views(model.backbone, glob)[0])


def test_short_run_schedules_ramp_distillation_and_warm_the_teacher_temperature():
    model, batch, _ = model_and_batch("default", "views.n_local=2", "objective.distill_warmup_steps=4",
                                      "objective.teacher_temp_start=0.02", "objective.teacher_temp=0.06",
                                      "objective.teacher_temp_warmup_steps=2")
    seen = []
    for _ in range(5):
        seen.append((float(model.distill_ramp()), model.current_teacher_temp()))
        terms = model(batch)
        parts = sum(model.weights[k] * v for k, v in terms.items() if k not in ("total", "distill", "ibot"))
        torch.testing.assert_close(terms["total"], parts + seen[-1][0] * (
            model.weights["distill"] * terms["distill"] + model.weights["ibot"] * terms["ibot"]))
    assert [r for r, _ in seen] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert [t for _, t in seen] == pytest.approx([0.02, 0.04, 0.06, 0.06, 0.06])
    assert int(model.state_dict()["steps_seen"]) == 5  # saved with the model, so a resume continues the ramp
    model.eval()
    model(batch)
    assert int(model.steps_seen) == 5  # evaluation forwards do not advance the schedule


def test_grid_heads_read_where_things_are():
    from gsdistill.models.vit_encoder import grid_pool
    patches = torch.arange(16.0).reshape(1, 16, 1)  # a 4x4 token map holding its own index
    pooled = grid_pool(patches, (64, 64), 16, 2)
    assert pooled.flatten().tolist() == [2.5, 4.5, 10.5, 12.5]  # means of the four 2x2 quadrants
    model, batch, _ = model_and_batch("mpcl_dual", "model.geom_pool_grid=2", "objective.geom_target=mean")
    assert model.align["geom"].head.net.in_features == 4 * model.backbone.embed_dim
    flipped = batch["global_crops"].flip(-1)
    a, b = model.embed_pages_geom(batch["global_crops"]), model.embed_pages_geom(flipped)
    assert not torch.allclose(a, b, atol=1e-4)  # a mirrored page has another layout
    terms = model(batch)
    # geom_target=mean: one text per page, the mean of its valid descriptor embeddings (InfoNCE)
    valid = batch["geom_valid"].unsqueeze(-1).float()
    mean = (batch["geom_emb"] * valid).sum(1) / valid.sum(1)
    head = model.align["geom"]
    z = head.embed_pages(model.head_inputs(*encode_views(model.backbone, batch["global_crops"], with_patches=True),
                                           batch["global_crops"].shape[-2:], "geom"))
    logits = head.logit_scale.scale * z @ head.embed_text(mean).T
    torch.testing.assert_close(terms["geom"], F.cross_entropy(logits, torch.arange(4).repeat(2)))


def test_symmetric_alignment_adds_the_text_to_page_direction():
    _, batch, _ = model_and_batch("mpcl_dual")
    torch.manual_seed(0)
    one_way = GSDistill(tiny("mpcl_dual"))
    torch.manual_seed(0)
    both = GSDistill(tiny("mpcl_dual", "objective.symmetric=true"))
    t1, t2 = one_way(batch), both(batch)
    h = encode_views(both.backbone, batch["global_crops"])[0]
    page_of_view = torch.arange(4).repeat(2)
    for name in ("sem", "geom"):
        head = both.align[name]
        z = head.embed_pages(h)
        valid = batch[f"{name}_valid"].reshape(-1)
        texts = head.embed_text(batch[f"{name}_emb"]).reshape(-1, z.shape[1])[valid]
        text_page = torch.arange(4).repeat_interleave(batch[f"{name}_valid"].shape[1])[valid]
        # SumMargLH (MPCL) per text: -log of the softmax mass on the views of its own page
        log_p = torch.log_softmax(head.logit_scale.scale * texts @ z.T, dim=1)
        own = text_page[:, None] == page_of_view[None, :]
        reverse = -torch.logsumexp(log_p.masked_fill(~own, float("-inf")), dim=1).mean()
        torch.testing.assert_close(t2[name], 0.5 * (t1[name] + reverse))


@pytest.mark.parametrize("align_views", ["unmasked", "visible"])
def test_patch_spread_term_reads_the_students_patch_tokens(align_views):
    """objective.patch_spread adds a named term, weighted into the total, equal to PatchSpreadLoss of
    the student's (fc-normed) patch tokens of the global views; its gradient reaches the backbone."""
    from gsdistill.losses import PatchSpreadLoss
    from gsdistill.models.vit_encoder import encode_views
    model, batch, cfg = model_and_batch(None, "objective.patch_spread=true", "objective.lambda_patch_spread=0.5",
                                        f"objective.align_views={align_views}", "objective.distill=false",
                                        "objective.ibot=false")
    model.eval()  # no drop-path: the reference pass sees the same tokens
    terms = model(batch)
    assert "patch_spread" in terms and model.weights["patch_spread"] == 0.5
    _, patches = encode_views(model.backbone, batch["global_crops"], with_patches=True)
    torch.testing.assert_close(terms["patch_spread"], PatchSpreadLoss(cov_weight=0.04)(patches.flatten(0, 1)))
    model.zero_grad()
    terms["patch_spread"].backward()
    assert model.backbone.patch_embed.proj.weight.grad.abs().sum() > 0
