"""tools/probes/probe_dino_targets.py: a DINO head that sends every page to one point gives uniform targets (entropy and
the student's cross-entropy at log K at best); a live head gives peaked targets."""
import math

import torch

from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.views.multicrop import MultiCropViews
from tests.test_pretrain_model import tiny
from tool_loader import load_tool

PAGES = list(generate_pages(8, seed=2, width=240, height=300, pages_per_doc=2))


def setup(*extra):
    cfg = tiny(None, "objective.teacher_temp=0.005", *extra)  # a sharp teacher, as in the real-page recipes
    torch.manual_seed(0)
    model = GSDistill(cfg).eval()
    return model, MultiCropViews.from_config(cfg.views, 16, seed=0)


def test_a_head_that_sends_every_page_to_one_point_gives_uniform_targets():
    tool = load_tool("probes/probe_dino_targets.py")
    model, views = setup()
    for head in (model.dino_head, model.teacher["dino_head"]):
        with torch.no_grad():
            head.mlp[-1].weight.zero_()
            head.mlp[-1].bias.copy_(torch.linspace(-1, 1, head.mlp[-1].bias.numel()))
    s = tool.dino_target_stats(model, views, PAGES, batch_size=4)
    log_k = math.log(model.dino_head.prototypes.shape[0])
    assert s["pages"] == 8 and s["bottleneck_cosine"] > 0.9999 and s["teacher_logit_std_over_pages"] < 1e-6
    assert abs(s["target_entropy"] - log_k) < 1e-3 and s["target_max_prob"] < 1.001 / s["K"]
    # against uniform targets the student's cross-entropy is log K + KL(uniform || student): log K at best
    assert s["dino_ce"] >= log_k - 1e-4


def test_a_live_head_gives_peaked_targets():
    tool = load_tool("probes/probe_dino_targets.py")
    model, views = setup()
    s = tool.dino_target_stats(model, views, PAGES, batch_size=4)
    assert s["bottleneck_cosine"] < 0.999 and s["target_entropy"] < s["log_K"] - 0.01
    assert 0.0 <= s["argmax_agree_other_page"] <= 1.0 and 0.0 <= s["argmax_agree_same_page"] <= 1.0
    assert abs(s["ratio_to_temp"] - s["teacher_logit_std_over_pages"] / 0.005) < 1e-3
