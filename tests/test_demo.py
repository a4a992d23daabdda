"""`gsdistill demo` end to end at its smallest size: every stage runs and the report's numbers are sane."""
from __future__ import annotations

import json
import math
import re

import pytest

from gsdistill.config import load_config
from gsdistill.detect.compare import markdown_table, summarize
from gsdistill.pipelines.demo import run_demo


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
                    "## 4. Page retrieval", "### Held-out pages", "### Training pages"):
        assert heading in text
    # every image the report links exists (loss curves, grad norm, predictions)
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) >= 3
    for rel in images:
        assert (out / rel).is_file(), rel
    # detection: one row per backbone with mean mAP in percent; retrieval: Acc@1 with a CI per model
    assert re.search(r"\| pretrained \| 1 \| \d+\.\d\d \| \d+\.\d\d \|", text)
    assert re.search(r"\| random backbone \| 1 \| \d+\.\d\d \|", text)
    assert re.search(r"\| geometric: all box descriptors \| 8\.3 \| \d+\.\d \[\d+\.\d, \d+\.\d\]", text)
    assert "Text height in the 64 px view" in text


def test_results_are_sane(demo_run):
    out, report = demo_run
    res = json.loads((out / "results.json").read_text())
    data = res["data"]
    assert data["train"]["pages"] == 24 and data["eval"]["pages"] == 12
    rows = res["detect"]["rows"]
    assert {r["backbone"] for r in rows} == {"pretrained", "random backbone"}
    # the summary and the report's table are recomputed from the per-run rows
    assert res["detect"]["summary"] == summarize(rows)
    assert markdown_table(summarize(rows)) in report.read_text()
    for r in rows:
        # mAP@[50:95] averages AP over IoU 0.50..0.95, each <= AP@50: a swapped pair fails
        assert r["map50_95"] <= r["map50"] and r["ul_map50_95"] <= r["ul_map50"]
        assert r["optimizer_steps"] == rows[0]["optimizer_steps"] >= 1 and r["epochs"] == rows[0]["epochs"]
    # the two detectors share the head and differ only in the frozen backbone's weights
    assert len({r["trainable_params"] for r in rows}) == 1 and len({r["total_params"] for r in rows}) == 1
    assert rows[0]["trainable_params"] < rows[0]["total_params"]
    ret = res["retrieval"]["rows"]
    models = {r["model"] for r in ret}
    assert models == {"pretrained", "random backbone, heads trained", "random (untrained)"}
    for r in ret:
        # Acc@1 is the share of per-page hits; the interval is a bootstrap of those same hits
        assert len(r["hits"]) == r["n_pages"] and set(r["hits"]) <= {0.0, 1.0}
        assert r["acc1"] == pytest.approx(sum(r["hits"]) / r["n_pages"], abs=1e-12)
        assert r["ci95"][0] <= r["acc1"] <= r["ci95"][1] and r["mrr"] >= r["acc1"]
        assert r["chance"] == 1 / r["n_pages"]
    held = [r for r in ret if r["split"] == "held-out"]
    assert {r["n_pages"] for r in held} == {12} and {(r["head"], r["k"]) for r in held} == {
        ("geom", "all"), ("sem", 1), ("sem", 5), ("sem", 8)}
    assert set(res["times_s"]) == {"tuples", "embed", "pretrain", "control", "detect", "detect budgets",
                                   "human labels", "retrieval", "report"}
    assert res["human_labels"] is None  # no human_labels folder given


def test_few_labels_and_few_epochs_keep_the_budget_and_pair_the_rows(demo_run):
    """smoke.yaml asks for half the pages (at the full set's optimizer steps) and 2 epochs: each setting
    trains both detectors on the same held-out pages and its table row holds their numbers."""
    out, report = demo_run
    res = json.loads((out / "results.json").read_text())
    half, two = res["detect_budgets"]
    full = json.loads((out / "detect" / "rows.json").read_text())[0]
    kept = json.loads((out / "detect_budgets" / "setting0" / "data" / "subset.json").read_text())
    assert half["train_images"] == kept["train_images"] == round(kept["of"] / 2) and kept["of"] == 16
    assert half["optimizer_steps"] >= full["optimizer_steps"]  # the labels change, not the budget
    assert two["epochs"] == 2 and two["train_images"] == 16 and two["optimizer_steps"] == 2 * full["optimizer_steps"]
    for setting in (half, two):
        diff = setting["paired"]["backbone"]["map50"]
        m = setting["map50"]
        assert diff["diff"] == pytest.approx(m["pretrained"] - m["random backbone"], abs=1e-9)
        assert diff["ci95"][0] <= diff["ci95"][1]
    text = report.read_text()
    assert "### Few labels, few epochs" in text
    assert re.search(rf"\| 50 % of the training pages \| 8 \| \d+ \| {half['optimizer_steps']} \| "
                     rf"{100 * half['map50']['pretrained']:.2f} \|", text)
    assert "| 2 head epochs | 16 | 2 |" in text


def test_pretraining_logged_every_term_finite(demo_run):
    out, _ = demo_run
    from gsdistill.pretrain.metrics_log import read_metrics
    rows = read_metrics(out / "pretrain" / "metrics.csv")
    assert len(rows) >= 2
    for term in ("total", "sem", "geom", "distill", "ibot", "koleo"):
        assert all(math.isfinite(float(r[term])) for r in rows), term
    assert (out / "pretrain" / "backbone" / "backbone.safetensors").is_file()


def test_pdf_folder_is_split_by_document_and_bad_files_are_reported(shared_data, tmp_path):
    import shutil

    from gsdistill.tuples.store.reader import read_manifest, read_pages
    from gsdistill.pipelines.demo_pdfs import build_pdf_split

    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    for f in sorted((shared_data / "arxiv_pdfs_docbank").glob("*.pdf")):
        shutil.copy(f, pdfs / f.name)
    (pdfs / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    (pdfs / "notes.txt").write_text("not a pdf")
    info = build_pdf_split(pdfs, tmp_path / "data", dpi=36, max_pages=100, pages_per_pdf=3,
                           eval_fraction=0.25, seed=0)
    everything = read_manifest(tmp_path / "data" / "all")
    assert everything["pages"] == 12 and everything["documents"] == 4
    reasons = {s["source"].split("/")[-1]: s["reason"] for s in everything["skipped"]}
    assert set(reasons) == {"broken.pdf", "notes.txt"} and "unsupported" in reasons["notes.txt"]
    train = {p["doc_id"] for p in read_pages(tmp_path / "data" / "train", decode_images=False)}
    held = {p["doc_id"] for p in read_pages(tmp_path / "data" / "eval", decode_images=False)}
    assert train and held and not train & held
    assert info["train"]["pages"] + info["eval"]["pages"] == 12
