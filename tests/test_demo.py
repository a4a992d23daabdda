"""`gsdistill demo` end to end at its smallest size: every stage runs and the report's numbers are sane."""
from __future__ import annotations

import json
import math
import re

import pytest

from gsdistill.config import load_config
from gsdistill.demo import run_demo


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    cfg = load_config("demo", "smoke", [f"out_dir={out}"])
    report = run_demo(cfg)
    return out, report


def test_report_has_every_section_with_numbers(demo_run):
    out, report = demo_run
    text = report.read_text()
    for heading in ("## 1. Page tuples", "## 2. GSDistill pretraining", "## 3. Layout detection",
                    "## 4. Crop-subsampled page retrieval"):
        assert heading in text
    # every image the report links exists (loss curves, grad norm, predictions, accuracy vs k)
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) >= 4
    for rel in images:
        assert (out / rel).is_file(), rel
    assert re.search(r"\| mAP@50 \(%\) \| \d+\.\d \| \d+\.\d \|", text)
    assert re.search(r"\| pretrained \(full objective\) \| per crop \(multi-positive\) \| \d+\.\d ± \d+\.\d", text)


def test_results_are_sane(demo_run):
    out, _ = demo_run
    res = json.loads((out / "results.json").read_text())
    data = res["data"]
    assert data["train"]["pages"] == 24 and data["eval"]["pages"] == 12
    det = res["detect"]
    assert 0.0 <= det["mAP50-95"] <= det["mAP50"] <= 1.0
    assert 0 < det["params_trainable"] < det["params_total"]
    summary = res["retrieval"]["results"]["summary"]
    for scoring in ("multi_positive", "single_positive"):
        for k in ("1", "5", "8"):
            acc = summary[scoring][k]["Acc@1"]["mean"]
            assert 0.0 <= acc <= 1.0 and summary[scoring][k]["MRR"]["mean"] >= acc
    assert set(res["times_s"]) == {"tuples", "embed", "pretrain", "detect", "retrieval", "report"}


def test_pretraining_logged_every_term_finite(demo_run):
    out, _ = demo_run
    from gsdistill.train.metrics_log import read_metrics
    rows = read_metrics(out / "pretrain" / "metrics.csv")
    assert len(rows) >= 2
    for term in ("total", "sem", "geom", "distill", "ibot", "koleo"):
        assert all(math.isfinite(float(r[term])) for r in rows), term
    assert (out / "pretrain" / "backbone" / "backbone.safetensors").is_file()
