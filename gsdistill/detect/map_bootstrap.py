"""Paired bootstrap of COCO detection mAP over held-out documents: is model B better than model A?

pycocotools' ``COCOeval.evaluate()`` runs once per prediction set (bbox, IoU 0.50:0.05:0.95, at most
100 detections per image and class, area "all"). :func:`match_table` keeps, per class, what COCO's
``accumulate`` reads: every detection in COCO's order (score descending, stable over images), its
image, whether it is a true or a false positive at each IoU threshold (detections matched to an
ignored ground truth are neither) and the non-ignored ground truths per image. :func:`coco_map`
then recomputes COCO's mAP for any multiset of images, given as image weights (a count per image:
an image drawn twice counts twice), without sorting again:

- a class's AP at threshold t is the mean over the 101 recall thresholds r of the monotone
  envelope of precision, read at the first position where recall = TP / n_gt reaches r (0 where it
  never does); classes whose sample holds no non-ignored ground truth are left out, as in COCO;
- copies of a detection are adjacent in the order, so the envelope is only needed at true
  positives (after a false positive precision is lower than at the true positive before it), and
  a true positive's copies all share the envelope of its last copy. With TP_j, FP_j the weighted
  counts up to the j-th true positive: P_j = TP_j / (TP_j + FP_j + eps), E_j = max_{j' >= j} P_j'.

:func:`paired_map_bootstrap` resamples documents with replacement and compares the seed-mean mAP
of two models on the same resampled images.
"""
from __future__ import annotations

import contextlib
import io
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix

EPS = np.spacing(1)  # COCO's guard in precision = tp / (fp + tp + eps)
CHUNK = 256  # resamples processed at once (memory: CHUNK x true positives of a class)


@dataclass
class ClassTable:
    """One class's detections over all images, in COCO's accumulate order (D detections, I images)."""
    img: np.ndarray  # [D] image index of each detection
    tp: np.ndarray  # [T, D] bool: matched, and not to an ignored ground truth, at IoU threshold t
    fp: np.ndarray  # [T, D] bool: unmatched and not ignored
    n_gt: np.ndarray  # [I] non-ignored ground truths of the class per image


def match_table(gt, dets: list[dict], img_ids: list[int], cat_ids: list[int]) -> tuple[list[ClassTable], np.ndarray]:
    """COCOeval.evaluate() once on ``dets`` (COCO result dicts); per class the arrays accumulate reads.

    Returns (one :class:`ClassTable` per ``cat_ids`` entry, COCO's recall thresholds [101]); image
    index i is the i-th of ``sorted(img_ids)``, the order of the weights :func:`coco_map` takes.
    """
    from pycocotools.cocoeval import COCOeval

    img_ids, n_img = sorted(img_ids), len(img_ids)
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(dets) if dets else None, "bbox")
        ev.params.imgIds, ev.params.catIds = img_ids, list(cat_ids)
        ev.params.areaRng, ev.params.areaRngLbl, ev.params.maxDets = [ev.params.areaRng[0]], ["all"], [100]
        if dets:
            ev.evaluate()
    n_thr, tables = len(ev.params.iouThrs), []
    index = {im: i for i, im in enumerate(img_ids)}
    for k, cat in enumerate(cat_ids):
        if dets:
            evals = ev.evalImgs[k * n_img:(k + 1) * n_img]  # one area range: [class][image]
            n_gt = np.array([0 if e is None else int((e["gtIgnore"] == 0).sum()) for e in evals])
            found = [(i, e) for i, e in enumerate(evals) if e is not None and len(e["dtScores"])]
        else:  # nothing to match: COCO's ignore flag of a ground truth is its iscrowd
            anns = gt.loadAnns(gt.getAnnIds(imgIds=img_ids, catIds=[cat]))
            n_gt = np.bincount([index[a["image_id"]] for a in anns if not a.get("iscrowd")], minlength=n_img)
            found = []
        if not found:
            empty = np.zeros((n_thr, 0), bool)
            tables.append(ClassTable(np.zeros(0, int), empty, empty, n_gt))
            continue
        scores = np.concatenate([e["dtScores"] for _, e in found])
        order = np.argsort(-scores, kind="mergesort")  # COCO's sort: stable, images in id order
        img = np.concatenate([np.full(len(e["dtScores"]), i) for i, e in found])[order]
        matched = np.concatenate([e["dtMatches"] for _, e in found], axis=1)[:, order] != 0
        ignored = np.concatenate([e["dtIgnore"] for _, e in found], axis=1)[:, order].astype(bool)
        tables.append(ClassTable(img, matched & ~ignored, ~matched & ~ignored, n_gt))
    return tables, np.asarray(ev.params.recThrs)


def recall_counts(n_gt: np.ndarray, rec_thrs: np.ndarray) -> np.ndarray:
    """[B, R]: the smallest true-positive count k with k / n_gt >= r, in COCO's float arithmetic (what its
    ``searchsorted(recall, r)`` finds); ceil(r * n_gt) is off by one where the product rounds across an integer."""
    n = np.maximum(n_gt, 1)[:, None].astype(np.float64)
    k = np.ceil(rec_thrs * n)
    k -= (k - 1) / n >= rec_thrs
    k += k / n < rec_thrs
    return k


def _class_ap(table: ClassTable, w: np.ndarray, rec_thrs: np.ndarray) -> np.ndarray:
    """AP [B, T] of one class for image weights ``w`` [B, I]; NaN where the sample has no ground truth."""
    n_boot, n_thr = len(w), len(table.tp)
    n_gt = w @ table.n_gt  # [B]
    k = recall_counts(n_gt, rec_thrs)  # [B, R]
    w_t = np.ascontiguousarray(w.T)  # [I, B]: sums run along axis 0, which numpy vectorises over B
    ap = np.zeros((n_boot, n_thr))
    for t in range(n_thr):
        pos = np.flatnonzero(table.tp[t])  # the true positives, J of them
        if len(pos) == 0:
            continue
        tp_cum = np.cumsum(w_t[table.img[pos]], axis=0)  # [J, B]: weighted TPs up to TP j
        fp = np.flatnonzero(table.fp[t])
        seg = np.searchsorted(pos, fp)  # true positives before each false positive
        keep = seg < len(pos)  # false positives after the last true positive change no envelope
        fp_in_seg = csr_matrix((np.ones(keep.sum()), (seg[keep], table.img[fp[keep]])), shape=(len(pos), len(w_t)))
        fp_cum = np.cumsum(fp_in_seg @ w_t, axis=0)  # [J, B]: weighted FPs before TP j
        # a true positive of an image not drawn repeats the previous one's counts: dominated, harmless
        prec = tp_cum / (fp_cum + tp_cum + EPS)
        env = np.maximum.accumulate(prec[::-1], axis=0)[::-1].T  # [B, J]
        # first true positive with tp_cum >= k: one searchsorted over all rows, offset so rows never mix
        span = max(tp_cum.max(), k.max()) + 1
        offset = np.arange(n_boot)[:, None] * span
        j = np.searchsorted((tp_cum.T + offset).ravel(), (k + offset).ravel()).reshape(k.shape)
        j -= np.arange(n_boot)[:, None] * len(pos)
        q = np.where(j < len(pos), np.take_along_axis(env, np.minimum(j, len(pos) - 1), axis=1), 0.0)
        ap[:, t] = q.mean(axis=1)
    ap[n_gt == 0] = np.nan
    return ap


def class_aps(tables: list[ClassTable], rec_thrs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AP [B, K, T] of each class at each IoU threshold for the image multisets ``weights`` [B, I]
    (COCOeval's ``precision`` averaged over recall); NaN where a sample holds none of the class."""
    weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    return np.concatenate([np.stack([_class_ap(t, weights[s:s + CHUNK], rec_thrs) for t in tables], axis=1)
                           for s in range(0, len(weights), CHUNK)])


def coco_map(tables: list[ClassTable], rec_thrs: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mAP@50 [B], mAP@[50:95] [B]) of the image multisets ``weights`` [B, I] (counts per image),
    as COCOeval's ``stats[1]`` and ``stats[0]``: mean AP over classes with ground truth (NaN if none)."""
    return _class_means(class_aps(tables, rec_thrs, weights))


def _class_means(ap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a sample without any ground truth: NaN (COCO's -1)
        return np.nanmean(ap[:, :, 0], axis=1), np.nanmean(ap.mean(axis=2), axis=1)


def ultralytics_to_coco(predictions: list[dict], sidecar: dict) -> list[dict]:
    """Ultralytics' ``predictions.json`` entries as COCO results of the sidecar's json (as ``coco_eval`` maps them)."""
    dets = []
    for p in predictions:
        stem = Path(p["file_name"]).stem
        if stem not in sidecar["image_ids"]:
            raise ValueError(f"prediction for image '{p['file_name']}' that the COCO sidecar does not list")
        cid = sidecar["category_ids"][int(p["category_id"]) - 1]  # Ultralytics writes class index + 1
        if cid is not None:
            dets.append({"image_id": sidecar["image_ids"][stem], "category_id": cid, "bbox": p["bbox"], "score": p["score"]})
    return dets


def _paired(a: np.ndarray, b: np.ndarray) -> dict:
    """Seed values ``[seeds, 1 + n_boot]`` of A and B (column 0: the full set) -> diff of the seed means and its 95 % CI."""
    diff = b.mean(axis=0) - a.mean(axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a class absent from every resample: NaN
        lo, hi = np.nanpercentile(diff[1:], [2.5, 97.5])
    return {"a": a[:, 0].tolist(), "b": b[:, 0].tolist(), "diff": float(diff[0]), "ci95": [float(lo), float(hi)]}


def stratified_draw(rng: np.random.Generator, stratum: list[str], n_boot: int) -> np.ndarray:
    """``[n_boot, U]`` unit indices: each stratum's units drawn with replacement from that stratum, as many as
    it holds (one stratum: the plain bootstrap, drawn as it always was, so earlier seeds give the same resamples)."""
    groups = [np.flatnonzero(np.array(stratum) == g) for g in sorted(set(stratum))]
    if len(groups) == 1:
        return rng.integers(0, len(stratum), size=(n_boot, len(stratum)))
    return np.hstack([g[rng.integers(0, len(g), size=(n_boot, len(g)))] for g in groups])


def paired_map_bootstrap(preds_a: list[list[dict]], preds_b: list[list[dict]], sidecar: dict,
                         doc_of: dict[str, str] | None = None, n_boot: int = 1000, seed: int = 0,
                         per_class: bool = False, strata: dict[str, str] | None = None) -> dict:
    """Seed-mean mAP of B minus A on the same held-out images, with a bootstrap over documents.

    Args:
        preds_a, preds_b: one Ultralytics prediction list per seed of each model (any number of seeds).
        sidecar: ``{"coco_json", "image_ids": {stem: id}, "category_ids": [json id per class]}`` of the split.
        doc_of: image stem -> document (default: the sidecar's ``doc_ids``, else each image its own).
        n_boot, seed: resamples of the documents (with replacement, as many as there are) and their RNG seed.
        per_class: also ``"per_class": {class name: {...}}``, each class's AP@50 compared the same way
            (a class can decide an mAP difference alone: a rare one is as heavy as a common one).
        strata: image stem -> stratum (default: the sidecar's ``strata``, else one): the documents are
            resampled within each stratum, as many as it holds (a stratified bootstrap). With 2-3 held-out
            books, pages resampled within each book keep every book's share of the set, which a bootstrap
            over the books themselves cannot estimate anything from.

    Returns:
        ``{"n_images", "n_docs", "n_strata", "n_boot", "unit", "seconds", "map50": {...}, "map50_95": {...}}``
        (``unit``: what was resampled, "pages" when every image is its own document) where each
        metric holds ``a``/``b`` (per seed, full set), ``diff`` (mean b - mean a) and ``ci95`` (2.5 and
        97.5 percentiles of the resampled diff).
    """
    from pycocotools.coco import COCO

    t0 = time.time()
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(sidecar["coco_json"])
    stems = sorted(sidecar["image_ids"], key=sidecar["image_ids"].get)  # COCO's image order: by id
    img_ids = [sidecar["image_ids"][s] for s in stems]
    cat_ids = sorted({c for c in sidecar["category_ids"] if c is not None})
    doc_of = doc_of if doc_of is not None else sidecar.get("doc_ids", {})
    docs, doc_index = np.unique([str(doc_of.get(s, s)) for s in stems], return_inverse=True)
    strata = strata if strata is not None else sidecar.get("strata") or {}
    stratum_of_doc = {}
    for s, d in zip(stems, doc_index):
        if stratum_of_doc.setdefault(d, str(strata.get(s, ""))) != str(strata.get(s, "")):
            raise ValueError(f"document '{docs[d]}' has images in two strata; a stratum holds whole documents")
    draw = stratified_draw(np.random.default_rng(seed), [stratum_of_doc[d] for d in range(len(docs))], n_boot)
    counts = np.bincount((draw + len(docs) * np.arange(n_boot)[:, None]).ravel(),
                         minlength=n_boot * len(docs)).reshape(n_boot, len(docs))
    weights = np.vstack([np.ones(len(stems)), counts[:, doc_index]])  # row 0: every image once

    def seed_aps(pred_sets):  # [seeds, 1 + n_boot, K, T]
        return np.array([class_aps(*match_table(gt, ultralytics_to_coco(p, sidecar), img_ids, cat_ids), weights)
                         for p in pred_sets])

    ap_a, ap_b = seed_aps(preds_a), seed_aps(preds_b)
    result = {"n_images": len(stems), "n_docs": len(docs), "n_strata": len(set(stratum_of_doc.values())), "n_boot": n_boot,
              "unit": "pages" if len(docs) == len(stems) else "documents"}
    means_a, means_b = zip(*map(_class_means, ap_a)), zip(*map(_class_means, ap_b))
    for key, a, b in zip(("map50", "map50_95"), means_a, means_b):
        result[key] = _paired(np.array(a), np.array(b))
    if per_class:
        names = [c["name"] for c in gt.loadCats(cat_ids)]
        result["per_class"] = {n: _paired(ap_a[:, :, k, 0], ap_b[:, :, k, 0]) for k, n in enumerate(names)}
    result["seconds"] = round(time.time() - t0, 2)
    return result


def rows_bootstrap(rows: list[dict], data_yaml: str | Path, a: str, b: str, n_boot: int = 1000, seed: int = 0,
                   split: str = "val", per_class: bool = False) -> dict:
    """:func:`paired_map_bootstrap` of two backbones of ``compare_backbones`` rows (their ``val_dir``
    holds ``predictions.json``) against the data YAML's ``coco_eval.json`` sidecar of ``split``."""
    sidecar = json.loads((Path(data_yaml).parent / "coco_eval.json").read_text())[split]

    def predictions(name: str) -> list[list[dict]]:
        files = [Path(r["val_dir"]) / "predictions.json" for r in sorted(rows, key=lambda r: r["seed"]) if r["backbone"] == name]
        if not files:
            raise ValueError(f"no rows for backbone '{name}'")
        return [json.loads(f.read_text()) if f.is_file() else [] for f in files]

    return {"a": a, "b": b, **paired_map_bootstrap(predictions(a), predictions(b), sidecar, n_boot=n_boot, seed=seed,
                                                        per_class=per_class)}
