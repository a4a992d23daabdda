"""gsdistill.detect.map_bootstrap: COCO's mAP recomputed for image multisets, and the paired bootstrap."""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from gsdistill.detect.evaluate import coco_eval
from gsdistill.detect.map_bootstrap import coco_map, match_table, paired_map_bootstrap, recall_counts


def _coco(dataset: dict) -> COCO:
    gt = COCO()
    gt.dataset = json.loads(json.dumps(dataset))
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    return gt


def _pycocotools_stats(dataset: dict, dets: list[dict]) -> tuple[float, float]:
    """(mAP@50, mAP@[50:95]) of the reference implementation: stats[1], stats[0]."""
    gt = _coco(dataset)
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(json.loads(json.dumps(dets))), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[1]), float(ev.stats[0])


def _ours(dataset: dict, dets: list[dict], weights=None) -> tuple[float, float]:
    img_ids = sorted(i["id"] for i in dataset["images"])
    tables, rec = match_table(_coco(dataset), json.loads(json.dumps(dets)), img_ids,
                              sorted(c["id"] for c in dataset["categories"]))
    m50, m95 = coco_map(tables, rec, np.ones(len(img_ids)) if weights is None else weights)
    return float(m50[0]), float(m95[0])


def _noisy_detections(dataset: dict, rng: np.random.Generator) -> list[dict]:
    """Ground truth jittered (some a lot), 15 % dropped, duplicates and false positives, random scores."""
    cats = [c["id"] for c in dataset["categories"]]
    dets = []
    for a in dataset["annotations"]:
        if rng.random() < 0.15:
            continue
        x, y, w, h = a["bbox"]
        for _ in range(1 + (rng.random() < 0.2)):  # a second box on the same object: a false positive
            s = rng.choice([0.03, 0.15])
            box = [x + rng.normal(0, s) * w, y + rng.normal(0, s) * h, w * (1 + rng.normal(0, s)), h * (1 + rng.normal(0, s))]
            dets.append({"image_id": a["image_id"], "category_id": a["category_id"], "bbox": box, "score": float(rng.random())})
    for im in dataset["images"]:
        for _ in range(rng.integers(0, 4)):
            x, y = rng.random() * im["width"] * 0.8, rng.random() * im["height"] * 0.8
            dets.append({"image_id": im["id"], "category_id": int(rng.choice(cats)), "score": float(rng.random()),
                         "bbox": [x, y, 20 + rng.random() * 150, 10 + rng.random() * 80]})
    return dets


def _repeat_images(dataset: dict, dets: list[dict], counts: dict[int, int]) -> tuple[dict, list[dict]]:
    """The multiset as a plain COCO set: image i ``counts[i]`` times, each copy with its own ids."""
    out = {**dataset, "images": [], "annotations": []}
    new_dets = []
    for im in dataset["images"]:
        for c in range(counts[im["id"]]):
            new_id = im["id"] + 10_000_000 * c
            out["images"].append({**im, "id": new_id})
            out["annotations"] += [{**a, "image_id": new_id, "id": len(out["annotations"]) + 1 + j}
                                   for j, a in enumerate(a for a in dataset["annotations"] if a["image_id"] == im["id"])]
            new_dets += [{**d, "image_id": new_id} for d in dets if d["image_id"] == im["id"]]
    return out, new_dets


@pytest.fixture(scope="module")
def publaynet(shared_data) -> dict:
    path = shared_data / "publaynet_examples" / "samples.json"
    if not path.is_file():
        pytest.skip(f"PubLayNet examples not found at {path}")
    return json.loads(path.read_text())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coco_map_equals_pycocotools_on_publaynet(publaynet, seed):
    dets = _noisy_detections(publaynet, np.random.default_rng(seed))
    ref50, ref95 = _pycocotools_stats(publaynet, dets)
    ours50, ours95 = _ours(publaynet, dets)
    assert 0.05 < ref95 < ref50 < 0.95  # a case with real misses, false positives and loose boxes
    assert ours50 == pytest.approx(ref50, abs=1e-9) and ours95 == pytest.approx(ref95, abs=1e-9)


def test_coco_map_of_a_multiset_equals_pycocotools_on_the_repeated_images(publaynet):
    rng = np.random.default_rng(7)
    data = json.loads(json.dumps(publaynet))
    for a in data["annotations"][::9]:
        a["iscrowd"] = 1  # crowd ground truth: detections on it are ignored, not counted
    dets = _noisy_detections(data, rng)
    counts = {im["id"]: int(c) for im, c in zip(data["images"], rng.integers(0, 4, len(data["images"])))}
    ref = _pycocotools_stats(*_repeat_images(data, dets, counts))
    weights = np.array([counts[i] for i in sorted(counts)])
    assert _ours(data, dets, weights) == pytest.approx(ref, abs=1e-9)
    assert _ours(data, dets) != pytest.approx(ref, abs=1e-4)  # the weights mattered


def test_recall_counts_are_cocos_searchsorted_on_recall():
    rec = np.linspace(0.0, 1.0, 101)
    n_gt = np.arange(1, 3001)
    expected = np.stack([np.searchsorted(np.arange(n + 1) / n, rec, side="left") for n in n_gt])
    assert np.array_equal(recall_counts(n_gt, rec), expected)


def _tiny() -> dict:
    """Image 1: two 'text' boxes; image 2: one 'table'; class 'list' has no ground truth."""
    return {"images": [{"id": 1, "width": 100, "height": 100}, {"id": 2, "width": 100, "height": 100}],
            "categories": [{"id": 1, "name": "text"}, {"id": 2, "name": "table"}, {"id": 3, "name": "list"}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 40, 20], "area": 800, "iscrowd": 0},
                            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [0, 50, 40, 20], "area": 800, "iscrowd": 0},
                            {"id": 3, "image_id": 2, "category_id": 2, "bbox": [10, 10, 50, 50], "area": 2500, "iscrowd": 0}]}


def test_coco_map_on_a_hand_made_case():
    # text: TP 0.9, FP 0.8, TP 0.7 -> precision 1, 1/2, 2/3; envelope 1 up to recall 0.5 (51 of the 101
    # thresholds), 2/3 above (50). table: never detected -> AP 0. list: a detection, no ground truth -> left out.
    dets = [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 40, 20], "score": 0.9},
            {"image_id": 1, "category_id": 1, "bbox": [60, 80, 30, 10], "score": 0.8},
            {"image_id": 1, "category_id": 1, "bbox": [0, 50, 40, 20], "score": 0.7},
            {"image_id": 2, "category_id": 3, "bbox": [0, 0, 10, 10], "score": 0.5}]
    text_ap = (51 + 50 * 2 / 3) / 101
    ours = _ours(_tiny(), dets)
    assert ours == pytest.approx((text_ap / 2, text_ap / 2), abs=1e-12)
    assert ours == pytest.approx(_pycocotools_stats(_tiny(), dets), abs=1e-12)
    # image 2 drawn twice, image 1 not: only 'table' has ground truth, never detected
    assert _ours(_tiny(), dets, [0, 2]) == (0.0, 0.0)
    assert _ours(_tiny(), [], [1, 1]) == (0.0, 0.0)  # no detections at all: every AP 0, as coco_eval says


def _small_split(tmp_path, n_docs: int = 12, pages: int = 3) -> tuple[dict, dict[int, str]]:
    """A COCO split of n_docs x pages images (3 classes, 4 boxes each) and its converter-style sidecar."""
    rng = np.random.default_rng(0)
    images, anns, stems, docs = [], [], {}, {}
    for i in range(n_docs * pages):
        images.append({"id": i + 1, "file_name": f"p{i}.png", "width": 400, "height": 500})
        stems[f"p{i}"], docs[f"p{i}"] = i + 1, f"doc{i // pages}"
        for j in range(4):
            box = [20 + 90 * j, 30 + rng.random() * 300, 60 + rng.random() * 20, 40 + rng.random() * 60]
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": 1 + (i + j) % 3, "bbox": box,
                         "area": box[2] * box[3], "iscrowd": 0})
    path = tmp_path / "val.json"
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": c, "name": f"c{c}"} for c in (1, 2, 3)]}))
    return {"coco_json": str(path), "image_ids": stems, "category_ids": [1, 2, 3], "doc_ids": docs}, \
        {v: k for k, v in stems.items()}


def _ultralytics(dataset_path: str, stem_of: dict[int, str], seed: int, noise: float) -> list[dict]:
    dataset = json.loads(open(dataset_path).read())
    dets = _noisy_detections(dataset, np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 100)
    for d in dets:  # more noise, worse boxes
        d["bbox"] = [v + rng.normal(0, noise) * d["bbox"][2 + k % 2] for k, v in enumerate(d["bbox"])]
    return [{"file_name": stem_of[d["image_id"]] + ".png", "category_id": d["category_id"], "bbox": d["bbox"],
             "score": d["score"]} for d in dets]


def test_bootstrap_of_identical_prediction_sets_is_zero_and_per_seed_values_are_coco_evals(tmp_path):
    sidecar, stem_of = _small_split(tmp_path)
    preds = [_ultralytics(sidecar["coco_json"], stem_of, s, 0.1) for s in (0, 1)]
    res = paired_map_bootstrap(preds, preds, sidecar, n_boot=200, seed=0)
    assert res["n_images"] == 36 and res["n_docs"] == 12 and res["n_boot"] == 200
    for key, coco_key in (("map50", "coco_mAP50"), ("map50_95", "coco_mAP50-95")):
        assert res[key]["diff"] == 0.0 and res[key]["ci95"] == [0.0, 0.0]
        expected = [coco_eval(p, sidecar, ["c1", "c2", "c3"])[coco_key] for p in preds]
        assert res[key]["a"] == pytest.approx(expected, abs=1e-9) and res[key]["b"] == res[key]["a"]


def test_bootstrap_finds_a_clearly_better_model_and_resamples_documents(tmp_path):
    sidecar, stem_of = _small_split(tmp_path)
    worse = [_ultralytics(sidecar["coco_json"], stem_of, s, 0.3) for s in (0, 1)]
    better = [_ultralytics(sidecar["coco_json"], stem_of, s, 0.0) for s in (2, 3, 4)]  # seed counts may differ
    res = paired_map_bootstrap(worse, better, sidecar, n_boot=300, seed=1)
    for key in ("map50", "map50_95"):
        lo, hi = res[key]["ci95"]
        assert 0 < lo < res[key]["diff"] < hi
        assert res[key]["diff"] == pytest.approx(np.mean(res[key]["b"]) - np.mean(res[key]["a"]))
    swapped = paired_map_bootstrap(better, worse, sidecar, n_boot=300, seed=1)
    assert swapped["map50"]["ci95"] == pytest.approx([-hi for hi in res["map50"]["ci95"][::-1]])
    # one document holding every page: every resample is the full set, so the interval is the point
    one_doc = paired_map_bootstrap(worse, better, sidecar, doc_of={s: "d" for s in stem_of.values()}, n_boot=50)
    assert one_doc["n_docs"] == 1 and one_doc["map50"]["ci95"] == pytest.approx([one_doc["map50"]["diff"]] * 2)


def test_converter_records_each_images_document_and_no_stale_stems(tmp_path):
    from gsdistill.detect.convert import pages_to_yolo
    from gsdistill.tuples.sources.synthetic import generate_pages

    pages = list(generate_pages(8, seed=1, width=240, height=300, pages_per_doc=2))
    pages_to_yolo(pages, tmp_path / "d", val_fraction=0.5, seed=0)
    side = json.loads((tmp_path / "d/coco_eval.json").read_text())
    doc_of = {p["id"]: p["doc_id"] for p in pages}
    for split in ("train", "val"):
        assert side[split]["doc_ids"] == {s: doc_of[s] for s in side[split]["image_ids"]}
    assert not set(side["train"]["doc_ids"].values()) & set(side["val"]["doc_ids"].values())
    pages_to_yolo(pages[:4], tmp_path / "d", val_fraction=0.5, seed=0)  # the same folder, fewer pages
    side = json.loads((tmp_path / "d/coco_eval.json").read_text())
    assert set(side["train"]["image_ids"]) | set(side["val"]["image_ids"]) == {p["id"] for p in pages[:4]}


def test_per_class_bootstrap_matches_pycocotools_and_averages_to_the_map_difference(tmp_path):
    sidecar, stem_of = _small_split(tmp_path)
    worse = [_ultralytics(sidecar["coco_json"], stem_of, s, 0.3) for s in (0, 1)]
    better = [_ultralytics(sidecar["coco_json"], stem_of, s, 0.0) for s in (2, 3, 4)]
    res = paired_map_bootstrap(worse, better, sidecar, n_boot=300, seed=1, per_class=True)
    assert list(res["per_class"]) == ["c1", "c2", "c3"]  # the COCO categories' names, in id order
    for preds, side in ((worse, "a"), (better, "b")):
        reference = [coco_eval(p, sidecar, ["c1", "c2", "c3"])["per_class"] for p in preds]
        for name, d in res["per_class"].items():
            assert d[side] == pytest.approx([r[name]["AP50"] for r in reference], abs=1e-9)
    # every class is in every image set, so mAP@50 is the plain mean of the classes' AP@50
    diffs = [d["diff"] for d in res["per_class"].values()]
    assert np.mean(diffs) == pytest.approx(res["map50"]["diff"], abs=1e-12)
    for d in res["per_class"].values():
        lo, hi = d["ci95"]
        assert 0 < lo <= d["diff"] <= hi  # clearly better boxes: better in each class too
    plain = paired_map_bootstrap(worse, better, sidecar, n_boot=300, seed=1)
    assert "per_class" not in plain and plain["map50"] == res["map50"] and plain["map50_95"] == res["map50_95"]


def test_stratified_bootstrap_resamples_within_each_stratum(tmp_path):
    from gsdistill.detect.map_bootstrap import stratified_draw

    stratum = ["b", "a", "b", "b", "a", "c"]
    draw = stratified_draw(np.random.default_rng(0), stratum, 500)
    assert draw.shape == (500, 6)
    for s in "abc":  # every resample holds as many units of each stratum as it has, all from that stratum
        members = [i for i, g in enumerate(stratum) if g == s]
        assert np.isin(draw, members).sum(axis=1).tolist() == [len(members)] * 500
    # and resampled: all 10 x 3 x 1 multisets (3 of 3 with replacement, 2 of 2, 1 of 1) turn up in 500 draws
    assert len({tuple(sorted(r)) for r in draw}) == 30
    sidecar, stem_of = _small_split(tmp_path)
    worse = [_ultralytics(sidecar["coco_json"], stem_of, s, 0.3) for s in (0, 1)]
    better = [_ultralytics(sidecar["coco_json"], stem_of, s, 0.0) for s in (2, 3)]
    pages = {s: s for s in stem_of.values()}  # every page its own unit
    by_book = paired_map_bootstrap(worse, better, sidecar, doc_of=pages, strata=sidecar["doc_ids"], n_boot=200)
    assert (by_book["unit"], by_book["n_docs"], by_book["n_strata"]) == ("pages", 36, 12)
    lo, hi = by_book["map50"]["ci95"]
    assert lo < by_book["map50"]["diff"] < hi  # pages drawn within their document: a real spread
    # one page a stratum: every resample is the full set, so the interval is the point
    alone = paired_map_bootstrap(worse, better, sidecar, doc_of=pages, strata=pages, n_boot=50)
    assert alone["map50"]["ci95"] == pytest.approx([alone["map50"]["diff"]] * 2)
    with pytest.raises(ValueError, match="two strata"):  # a document split across strata
        paired_map_bootstrap(worse, better, sidecar, strata=pages, n_boot=10)
