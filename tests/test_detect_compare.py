"""gsdistill.detect.compare: same head, same budget, same held-out pages for every backbone and seed."""
from __future__ import annotations

import json
import statistics

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.detect.compare import compare_backbones, markdown_table, summarize
from gsdistill.models.backbone import create_backbone, load_backbone, save_backbone

TINY = {"name": "vit_tiny_patch16_224", "depth": 1, "embed_dim": 32, "num_heads": 2}


def test_compare_backbones_rows_and_spread(tmp_path):
    torch.manual_seed(0)
    pre = save_backbone(create_backbone(TINY), TINY, tmp_path / "pre")
    pages = generate_pages(6, seed=2, width=200, height=224, pages_per_doc=1)
    cfg = load_config("detect", "compare", ["epochs=1", "imgsz=64", "batch=4", "adapter_channels=16"])
    rows = compare_backbones(pages, {"pretrained": str(pre), "random": None, "yolov10n": "yolov10n.yaml"},
                             seeds=[0, 1], cfg=cfg, out_dir=tmp_path / "cmp")
    assert [(r["backbone"], r["seed"]) for r in rows] == [(b, s) for s in (0, 1)
                                                          for b in ("pretrained", "random", "yolov10n")]
    assert json.loads((tmp_path / "cmp/rows.json").read_text()) == rows
    vit = [r for r in rows if r["backbone"] != "yolov10n"]
    # same head, same budget: identical parameter counts and optimizer steps for every ViT row
    assert len({(r["trainable_params"], r["total_params"], r["optimizer_steps"], r["imgsz"]) for r in vit}) == 1
    assert vit[0]["optimizer_steps"] == 1 and all(r["frozen_backbone"] for r in vit)  # 4 train pages, batch 4
    yolo = [r for r in rows if r["backbone"] == "yolov10n"]
    assert all(not r["frozen_backbone"] and r["trainable_params"] == r["total_params"] - 16 for r in yolo)
    for r in rows:
        assert 0.0 <= r["map50_95"] <= r["map50"] <= 1.0 and r["wall_s"] >= r["train_s"] > 0
    # the random twin has the pretrained architecture and a seed-dependent init
    twins = [load_backbone(tmp_path / f"cmp/backbones/random_s{s}") for s in (0, 1)]
    ref = load_backbone(pre).state_dict()
    assert all(t.state_dict().keys() == ref.keys() for t in twins)
    assert not torch.equal(twins[0].state_dict()["blocks.0.attn.qkv.weight"], twins[1].state_dict()["blocks.0.attn.qkv.weight"])
    summary = summarize(rows)
    for s in summary:
        values = [r["map50"] for r in rows if r["backbone"] == s["backbone"]]
        assert s["n"] == 2 and s["map50_mean"] == pytest.approx(statistics.mean(values))
        assert s["map50_std"] == pytest.approx(statistics.stdev(values))  # sample std, ddof=1
    assert "± " in markdown_table(summary) and "| yolov10n | 2 |" in markdown_table(summary)


def test_summarize_sample_std_formula():
    rows = [{"backbone": "a", "map50": v, "map50_95": v / 2, "optimizer_steps": 3, "trainable_params": 10,
             "wall_s": 1.0} for v in (0.1, 0.2, 0.6)]
    (s,) = summarize(rows)
    mean = 0.3
    assert s["map50_std"] == pytest.approx(((0.04 + 0.01 + 0.09) / 2) ** 0.5) and s["map50_mean"] == pytest.approx(mean)
    assert summarize(rows[:1])[0]["map50_std"] is None  # one seed: no spread, not a zero one
