"""The demo's measured reason for DINO at log K (teacher_logit_spread, distill_verdict): numbers against a direct
computation, and a DINO head that sends every page to one point is found and named."""
from __future__ import annotations

import torch

from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pipelines.demo_learning import mean_pairwise_cosine, teacher_logit_spread
from gsdistill.pipelines.demo_report import distill_verdict
from gsdistill.tuples.sources.synthetic import generate_pages
from tests.test_pretrain_model import tiny

PAGES = list(generate_pages(6, seed=5, width=240, height=300, pages_per_doc=2))


def model() -> GSDistill:
    torch.manual_seed(0)
    return GSDistill(tiny(None)).eval()


def test_mean_pairwise_cosine_against_a_pair_loop():
    x = torch.randn(5, 7, dtype=torch.float64)
    loop = [torch.nn.functional.cosine_similarity(x[i], x[j], dim=0) for i in range(5) for j in range(5) if i != j]
    assert abs(mean_pairwise_cosine(x) - float(torch.stack(loop).mean())) < 1e-6
    assert abs(mean_pairwise_cosine(torch.ones(4, 3)) - 1.0) < 1e-6


def test_spread_matches_the_teachers_logits_and_its_parts():
    from gsdistill.eval.page_gallery import _image_tensor
    from gsdistill.models.vit_encoder import encode_views
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    m = model()
    s = teacher_logit_spread(m, PAGES, 32, batch_size=4)  # two batches: 4 + 2 pages
    x = torch.stack([_image_tensor(p["image"], 32) for p in PAGES]).float() / 255.0
    x = (x - torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        h = encode_views(m.teacher["backbone"], x)[0]
        logits = m.teacher["dino_head"](h)
        z = m.teacher["dino_head"].mlp(h)
    assert s["pages"] == 6
    assert abs(s["std_over_pages"] - float(logits.std(0).mean())) < 1e-5
    assert abs(s["ratio"] - s["std_over_pages"] / m.teacher_temp) < 1e-3
    assert abs(s["input_cosine"] - mean_pairwise_cosine(h)) < 1e-5
    assert abs(s["bottleneck_cosine"] - mean_pairwise_cosine(z)) < 1e-5
    assert s["bottleneck_cosine"] < 0.999


def test_a_head_that_sends_every_page_to_one_point_is_named():
    m = model()
    last = m.teacher["dino_head"].mlp[-1]
    with torch.no_grad():  # a constant bottleneck: every page the same logits, whatever the backbone says
        last.weight.zero_()
        last.bias.copy_(torch.linspace(-1, 1, last.bias.numel()))
    s = teacher_logit_spread(m, PAGES, 32)
    assert s["std_over_pages"] < 1e-6 and s["bottleneck_cosine"] > 0.9999 and s["input_cosine"] < 0.9999
    text = "\n".join(distill_verdict({"distill": (7.1, 6.93)}, 64, s))
    assert "within" in text and "one point" in text
    s["bottleneck_cosine"] = 0.5
    assert "one point" not in "\n".join(distill_verdict({"distill": (7.1, 6.93)}, 64, s))
