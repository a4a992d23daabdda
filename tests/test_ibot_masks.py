"""`ibot_masks`: the benchmarks' iBOT masks, drawn as the views pipeline draws them or as the average
masking whose counted FLOPs are a training step's expected FLOPs (gpu_check's share of the peak)."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from gsdistill.config import load_config
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import ibot_masks, tensor_batch
from gsdistill.views.masking import view_mask

TINY = ["model.backbone.depth=1", "model.backbone.img_size=64", "views.global_size=64", "views.local_size=32",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "views.mask_prob=0.5", "views.mask_ratio=[0.1,0.5]"]


def test_drawn_masks_are_the_pipelines_draws():
    views = {"mask_prob": 0.5, "mask_ratio": [0.1, 0.5]}
    rng = np.random.default_rng(7)
    expected = np.stack([view_mask((6, 6), 0.5, (0.1, 0.5), rng) for _ in range(10)])
    np.testing.assert_array_equal(ibot_masks(views, 10, (6, 6), seed=7).numpy(), expected)


def test_mean_masks_mask_the_expected_views_at_the_middle_ratio():
    masks = ibot_masks({"mask_prob": 0.5, "mask_ratio": [0.1, 0.5]}, 8, (14, 14), mean=True)
    per_view = masks.sum(1)
    assert int((per_view > 0).sum()) == 4  # round(0.5 * 8) views
    assert set(per_view[per_view > 0].tolist()) == {round(0.3 * 196)}


def _flops(model, batch) -> float:
    with FlopCounterMode(display=False) as counter:
        model(batch)["total"].backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def test_mean_masks_count_the_expected_flops():
    """A step's FLOPs are linear in the masked views (their unmasked copies, their iBOT rows): the
    average batch counts none-masked + mask_prob * (all-masked - none-masked)."""
    cfg = load_config("pretrain", None, TINY)
    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    mean = tensor_batch(cfg, 2, mean_masks=True)
    n_masked = round(0.3 * 16)
    all_masked = dict(mean, masks=torch.stack([mean["masks"][0]] * len(mean["masks"])))
    none_masked = dict(mean, masks=torch.zeros_like(mean["masks"]))
    assert int(mean["masks"].any(1).sum()) == 2 and int(mean["masks"][0].sum()) == n_masked
    f_none, f_all, f_mean = (_flops(model, b) for b in (none_masked, all_masked, mean))
    assert f_all > f_none
    assert f_mean == f_none + 0.5 * (f_all - f_none)
