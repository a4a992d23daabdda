"""The demo report claims only what its intervals show (issue 21, item 5)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gsdistill.detect.convert import pages_to_yolo
from gsdistill.detect.map_bootstrap import rows_bootstrap
from gsdistill.pipelines.demo_report import retrieval_section
from gsdistill.pipelines.demo_report_detect import detect_section
from gsdistill.pipelines.report_text import chance_claim, claim
from gsdistill.tuples.sources.synthetic import generate_pages

NO_DIFF = "no measurable difference (the 95 % interval includes 0)"
REFERENCE = "yolov10n.yaml (stock, all layers trained)"


def test_claim_says_higher_only_when_the_interval_excludes_zero():
    assert claim("A", "B", 1.2, (0.1, 2.0), "points") == "B − A: +1.2 [+0.1, +2.0] points: B higher"
    assert claim("A", "B", -1.2, (-2.0, -0.1), "points").endswith(": A higher")
    for ci in ((-0.5, 2.0), (0.0, 2.0), (-2.0, 0.0), (0.0, 0.0)):
        assert claim("A", "B", 0.7, ci, "points").endswith(": " + NO_DIFF)


def test_chance_claim_needs_the_whole_interval_past_chance():
    assert chance_claim("m", 2.0, (0.0, 4.8), 0.7).endswith("not distinguishable from chance (the 95 % interval includes chance)")
    assert chance_claim("m", 2.0, (0.7, 4.8), 0.7).endswith("not distinguishable from chance (the 95 % interval includes chance)")
    assert chance_claim("m", 30.0, (20.0, 40.0), 0.7) == "m: 30.0 [20.0, 40.0] % vs chance 0.7 %: above chance"
    assert chance_claim("m", 0.0, (0.0, 0.2), 0.7).endswith(": below chance")


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    """A converted detection set (page tuples, split by document) and its val COCO json."""
    out = tmp_path_factory.mktemp("det")
    data_yaml = pages_to_yolo(generate_pages(24, seed=3, width=240, height=300, pages_per_doc=2), out / "data",
                              val_fraction=0.5, seed=0)
    sidecar = json.loads((out / "data" / "coco_eval.json").read_text())["val"]
    return out, data_yaml, sidecar, json.loads(open(sidecar["coco_json"]).read())


def _predictions(coco: dict, seed: int, noise: float, drop: float) -> list[dict]:
    """Ground-truth boxes as Ultralytics predictions (class index + 1), jittered and some dropped."""
    rng = np.random.default_rng(seed)
    names = {i["id"]: i["file_name"] for i in coco["images"]}
    return [{"file_name": names[a["image_id"]], "category_id": a["category_id"], "score": float(rng.random()),
             "bbox": [v + rng.normal(0, noise) * a["bbox"][2 + k % 2] for k, v in enumerate(a["bbox"])]}
            for a in coco["annotations"] if rng.random() >= drop]


def _detection(out, data_yaml, sets: dict[str, list[list[dict]]], ref_map50: float) -> dict:
    """The ``detect`` entry of results.json for these prediction sets (one list per seed and backbone)."""
    rows = []
    for name, per_seed in sets.items():
        for seed, preds in enumerate(per_seed):
            val_dir = out / "val" / f"{name}_{seed}"
            val_dir.mkdir(parents=True, exist_ok=True)
            (val_dir / "predictions.json").write_text(json.dumps(preds))
            rows.append({"backbone": name, "seed": seed, "val_dir": str(val_dir)})
    summary = [{"backbone": n, "n": len(p), "map50_mean": ref_map50 if n == REFERENCE else 0.5, "map50_std": None,
                "map50_95_mean": 0.2, "map50_95_std": None, "optimizer_steps": 10, "trainable_params": 1e6,
                "wall_s_mean": 1.0, "cpu_s_mean": 1.0} for n, p in sets.items()]
    paired = {"backbone": rows_bootstrap(rows, data_yaml, "random backbone", "pretrained", n_boot=200, per_class=True)}
    if REFERENCE in sets:
        paired["reference"] = rows_bootstrap(rows, data_yaml, REFERENCE, "pretrained", n_boot=200)
    return {"summary": summary, "paired": paired, "predict_conf": 0.25, "predictions": []}


def test_equal_detection_results_claim_no_difference(held_out):
    out, data_yaml, sidecar, coco = held_out
    preds = [_predictions(coco, s, 0.1, 0.2) for s in (0, 1)]
    det = _detection(out, data_yaml, {"pretrained": preds, "random backbone": preds, REFERENCE: preds[:1]}, 0.05)
    text = "\n".join(detect_section(det, out, 0.10))
    assert f"- mAP@50, pretrained − random backbone: +0.00 [+0.00, +0.00] points: {NO_DIFF}" in text
    assert f"- mAP@[50:95], pretrained − random backbone: +0.00 [+0.00, +0.00] points: {NO_DIFF}" in text
    assert " higher" not in text
    # a class with no held-out boxes has no AP (NaN): said so, not printed as a number
    absent = {**det["paired"]["backbone"], "per_class": {"figure": {"a": [float("nan")], "b": [float("nan")],
                                                                    "diff": float("nan"), "ci95": [float("nan")] * 2}}}
    text = "\n".join(detect_section({**det, "paired": {**det["paired"], "backbone": absent}}, out, 0.10))
    assert "- figure: no held-out boxes of this class" in text and "nan" not in text
    # the documents are the converter's: pages of one document are resampled together
    assert det["paired"]["backbone"]["n_docs"] == len(set(sidecar["doc_ids"].values())) < len(sidecar["doc_ids"])
    assert ("reached 5.00 % mAP@50 on the held-out pages, below the 10 % this report requires "
            "(`report_min_reference_map50`): the detection set-up learned too little") in text


def test_a_clearly_better_detector_is_claimed_higher(held_out):
    out, data_yaml, _, coco = held_out
    good = [_predictions(coco, s, 0.0, 0.0) for s in (0, 1)]
    poor = [_predictions(coco, s, 0.3, 0.5) for s in (2, 3)]
    det = _detection(out, data_yaml, {"pretrained": good, "random backbone": poor, REFERENCE: poor[:1]}, 0.30)
    text = "\n".join(detect_section(det, out, 0.10))
    for metric in ("mAP@50", "mAP@[50:95]"):
        assert f"- {metric}, pretrained − random backbone: +" in text
        assert f"- {metric}, pretrained − {REFERENCE}: +" in text
    classes = list(det["paired"]["backbone"]["per_class"])
    assert len(classes) >= 3 and "AP@50 of each class" in text
    for name in classes:  # one claim per class, from the same bootstrap
        assert f"- {name}: pretrained − random backbone: +" in text
    assert text.count("points: pretrained higher") == 4 + len(classes) and NO_DIFF not in text
    assert "reached 30.00 % mAP@50 on the held-out pages, at least the 10 %" in text and "too little" not in text
    assert f"pretrained backbone vs {REFERENCE}, same budget:" in text
    assert "same architecture, and a stock" in text  # no head named: the sentence reads without it
    from gsdistill.config import load_config
    from gsdistill.pipelines.demo import head_name
    neck = head_name(load_config("detect", "compare", ["adapter_neck=pan"]))
    named = "\n".join(detect_section({**det, "head": neck}, out, 0.10))
    assert ("same architecture (trained: a simple feature pyramid of 64 channels + YOLOv10's neck + v10Detect), "
            "and a stock") in named
    own = "\n".join(detect_section({**det, "reference_overrides": ["lr0=0.002"]}, out, 0.10))
    assert (f"pretrained backbone vs {REFERENCE}, same optimizer steps, the reference with its own `lr0=0.002` "
            "(`detect_reference_overrides`") in own
    swapped = _detection(out, data_yaml, {"pretrained": poor, "random backbone": good}, 0.30)
    text = "\n".join(detect_section(swapped, out, 0.10))
    assert text.count("points: random backbone higher") == 2 + len(classes) and "No stock reference was trained" in text


def _retrieval(hits: dict[str, list[float]], sem5_ci: tuple[float, float]) -> dict:
    rows = []
    for model, h in hits.items():
        for split in ("held-out", "training"):
            for head, k in (("geom", "all"), ("sem", 1), ("sem", 5), ("sem", 8)):
                acc = float(np.mean(h))
                rows.append({"model": model, "split": split, "head": head, "k": k, "hits": h, "acc1": acc,
                             "ci95": list(sem5_ci) if k == 5 else [acc, acc], "chance": 1 / len(h), "effective_rank": 3.0})
    return {"rows": rows, "image_size": 112, "doc_ids": {"held-out": [f"d{i // 2}" for i in range(len(next(iter(hits.values()))))]}}


def test_retrieval_claims_follow_the_intervals():
    same = [1.0, 0.0] * 20
    models = ("pretrained", "random backbone, heads trained", "random (untrained)")
    text = "\n".join(retrieval_section(_retrieval(dict.fromkeys(models, same), (0.0, 0.048)), {"Title": 3.0}))
    assert text.count(f"points: {NO_DIFF}") == 2 and " higher" not in text
    assert text.count("- semantic Acc@1 from 5 text crops, ") == 3
    assert text.count("vs chance 2.5 %: not distinguishable from chance") == 3
    assert "All below about 8 px" in text
    better = {"pretrained": [1.0] * 40, "random backbone, heads trained": [0.0] * 40, "random (untrained)": [0.0] * 40}
    text = "\n".join(retrieval_section(_retrieval(better, (0.3, 0.6)), {"Title": 12.0}))
    assert "- geometric Acc@1, pretrained − random backbone, heads trained: +100.0 [+100.0, +100.0] points: pretrained higher" in text
    assert text.count(": above chance") == 3 and "All at or above about 8 px" in text
