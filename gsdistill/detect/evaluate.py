"""Detection evaluation: Ultralytics mAP and pycocotools COCOeval from the same predictions.

Ultralytics' validator scores with a 101-point interpolated PR curve of its own; COCOeval is the
reference implementation. Both see exactly the same boxes: the validator writes its predictions
(``predictions.json``, original image pixels) and :func:`coco_eval` maps them back to the image
and category ids of the original COCO json (via the converter's ``coco_eval.json``).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")

from ultralytics.models.yolo.detect import DetectionValidator  # noqa: E402

from gsdistill.detect.checks import check_yolo_dataset, read_data_yaml  # noqa: E402
from gsdistill.detect.modules import BACKBONE_LAYER  # noqa: E402
from gsdistill.detect.safe_load import load_yolo  # noqa: E402
from gsdistill.output_folder import OutputConflict, check_output_dir, lock_folder  # noqa: E402
from gsdistill.output_removal import discard  # noqa: E402
from gsdistill.tuples.store.folder import removed_if_left_empty  # noqa: E402


def checkpoint_imgsz(model, explicit: int | None, fallback: int) -> int:
    """Evaluation size: ``explicit`` when set, else the checkpoint's training ``imgsz`` (what Ultralytics
    itself defaults to), else ``fallback`` (an untrained export has no training size)."""
    if explicit is not None:
        return int(explicit)
    trained = ((getattr(model, "ckpt", None) or {}).get("train_args") or {}).get("imgsz")
    if isinstance(trained, (list, tuple)):  # Ultralytics allows [h, w]; the detectors here train square
        trained = max(trained)
    return int(trained) if trained else int(fallback)


def val_dir_name(weights: str | Path) -> str:
    """``<run>_<stem>_<hash>_val``: two ``best.pt`` of different runs never share (and overwrite) a report folder."""
    path = Path(weights).resolve()
    run = path.parent.parent.name if path.parent.name == "weights" else path.parent.name
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    return f"{run}_{path.stem}_{digest}_val"


class PredictionRecordingValidator(DetectionValidator):
    """Ultralytics' validator, minus its own COCO scoring (faster-coco-eval, which it would pip-install)."""

    def coco_evaluate(self, stats, pred_json, anno_json, iou_types="bbox", suffix="Box"):
        return stats


def param_counts(det_model, frozen: bool) -> tuple[int, int]:
    """(total, trainable) as Ultralytics' trainer sets them: layer 0 when frozen and the fixed DFL conv."""
    total = trainable = 0
    for name, p in det_model.named_parameters():
        total += p.numel()
        if not ((frozen and name.startswith(f"model.{BACKBONE_LAYER}.")) or ".dfl" in name):
            trainable += p.numel()
    return total, trainable


def _per_class_coco(evaluator, cat_ids: list[int]) -> dict[int, dict[str, float]]:
    """AP@[.5:.95] and AP@.5 per category from COCOeval's precision array [T, R, K, A, M]."""
    prec = evaluator.eval["precision"][:, :, :, 0, -1]  # area "all", max dets 100
    out = {}
    for k, cid in enumerate(evaluator.params.catIds):
        if cid not in cat_ids:
            continue
        p_all, p50 = prec[:, :, k], prec[0, :, k]
        out[cid] = {"AP50-95": float(p_all[p_all > -1].mean()) if (p_all > -1).any() else float("nan"),
                    "AP50": float(p50[p50 > -1].mean()) if (p50 > -1).any() else float("nan")}
    return out


def coco_eval(predictions: list[dict], sidecar: dict, names: list[str]) -> dict:
    """pycocotools COCOeval (bbox) of Ultralytics predictions against the original COCO json.

    ``sidecar``: ``{"coco_json", "image_ids": {file stem: json image id}, "category_ids": [json id per
    class index]}`` as written by the converters. Only the images of the evaluated split count.
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    stem_to_id = sidecar["image_ids"]
    class_cat = sidecar["category_ids"]
    dets = []
    for p in predictions:
        stem = Path(p["file_name"]).stem
        cid = class_cat[int(p["category_id"]) - 1]  # Ultralytics writes class index + 1 for custom data
        if stem not in stem_to_id:
            raise ValueError(f"prediction for image '{p['file_name']}' that the COCO sidecar does not list")
        if cid is not None:
            dets.append({"image_id": stem_to_id[stem], "category_id": cid, "bbox": p["bbox"], "score": p["score"]})
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(sidecar["coco_json"])
        img_ids = sorted(stem_to_id.values())
        cat_ids = sorted({c for c in class_cat if c is not None})
        if not dets:
            return {"coco_mAP50": 0.0, "coco_mAP50-95": 0.0, "per_class": {}}
        ev = COCOeval(gt, gt.loadRes(dets), "bbox")
        ev.params.imgIds, ev.params.catIds = img_ids, cat_ids
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    per_cat = _per_class_coco(ev, cat_ids)
    # classes without ground truth in the split get NaN from COCOeval: left out
    per_class = {names[i]: per_cat[c] for i, c in enumerate(class_cat)
                 if c in per_cat and per_cat[c]["AP50"] == per_cat[c]["AP50"]}
    return {"coco_mAP50": float(ev.stats[1]), "coco_mAP50-95": float(ev.stats[0]), "per_class": per_class}


def _sidecar_for(data_yaml: Path, split: str, coco_json: str | Path | None, names: list[str],
                 image_dir: Path) -> dict | None:
    """The converter's sidecar for ``split``; or one built from a given COCO json by file stem and name."""
    if coco_json is None:
        path = data_yaml.parent / "coco_eval.json"
        return json.loads(path.read_text()).get(split) if path.is_file() else None
    coco = json.loads(Path(coco_json).read_text())
    by_name = {c["name"].lower(): c["id"] for c in coco["categories"]}
    stems = {p.stem for p in image_dir.iterdir()}
    return {"coco_json": str(coco_json),
            "image_ids": {Path(i["file_name"]).stem: i["id"] for i in coco["images"]
                          if Path(i["file_name"]).stem in stems},
            "category_ids": [by_name.get(n.lower()) for n in names]}


def validate(weights: str | Path, data_yaml: str | Path, coco_json: str | Path | None = None, cfg=None) -> dict:
    """Ultralytics val + pycocotools on the same predictions; returns the report dict.

    Keys: ``mAP50``, ``mAP50-95`` (Ultralytics), ``coco_mAP50``, ``coco_mAP50-95`` (pycocotools; None
    when no COCO json is known), ``per_class`` (``{name: {"AP50", "AP50-95", "coco_AP50",
    "coco_AP50-95"}}``), ``params_total``, ``params_trainable``, ``imgsz`` (``val.imgsz``, else the
    checkpoint's training size), ``weights``, ``save_dir`` (``<project>/<run>_<stem>_<hash of the weights
    path>_val``), ``images_skipped`` and ``skipped_images`` (images that do not decode: left out of
    both scorers). The report is also written to ``<save_dir>/report.json``. ``save_dir`` is checked
    against the inputs (the weights, data YAML, evaluated split and COCO json) before anything is read,
    and locked while it is written.
    """
    from gsdistill.config import load_config

    cfg = cfg or load_config("detect")
    data_yaml = Path(data_yaml)
    data = read_data_yaml(data_yaml)
    split = str(cfg.val.split)
    save_dir = Path(cfg.project).resolve() / val_dir_name(weights)
    # before the data is checked or the model loaded: the report folder is no input, nor in or around one
    check_output_dir(save_dir, "project (val report folder)", inputs=val_inputs(weights, data_yaml, data, split,
                                                                                coco_json))
    checked = check_yolo_dataset(data_yaml, splits=(split,), allow_empty_labels=bool(cfg.data_check.allow_empty_labels))
    model = load_yolo(weights, safe=bool(cfg.safe_load))
    # a second val of the same weights into the same folder: refused with the holder's PID; a val that
    # fails before writing leaves no empty folder behind
    with removed_if_left_empty(save_dir, save_dir.parent), lock_folder(save_dir):
        return _validate(model, weights, data_yaml, data, split, checked, coco_json, cfg, save_dir)


def val_inputs(weights, data_yaml: Path, data: dict, split: str, coco_json) -> list[tuple[str, Path]]:
    """What ``val`` reads, which its report folder must neither be, lie in nor hold."""
    from gsdistill.detect.checks import split_dir
    inputs = [("weights", Path(weights)), ("data", data_yaml)]
    if isinstance(data.get(split), str):
        inputs.append((f"data {split} split", split_dir(data_yaml, data, split)))
    if coco_json is not None:
        inputs.append(("--coco-json", Path(coco_json)))
    return inputs


def _validate(model, weights, data_yaml: Path, data: dict, split: str, checked: dict, coco_json, cfg,
              save_dir: Path) -> dict:
    from gsdistill.detect.checks import readable_data_yaml, skipped_images, split_dir
    from gsdistill.detect.device_string import resolve_device

    train_args = (model.ckpt or {}).get("train_args") or {}
    frozen = bool(train_args.get("freeze")) if train_args else bool(cfg.frozen)
    imgsz = checkpoint_imgsz(model, cfg.val.imgsz, cfg.imgsz)
    if discard(save_dir / "predictions.json").kept:  # never score a previous run's boxes; never remove the user's
        raise OutputConflict(f"project (val report folder) {save_dir}: predictions.json there is a file gsdistill did "
                             "not write, and val writes predictions.json; move it or set another project")
    skipped = skipped_images(checked)
    readable = readable_data_yaml(data_yaml, checked, save_dir / "data")
    metrics = model.val(validator=PredictionRecordingValidator, data=str(readable), split=split,
                        imgsz=imgsz, batch=cfg.batch, conf=cfg.val.conf, iou=cfg.val.iou,
                        max_det=cfg.val.max_det, device=resolve_device(cfg.device), plots=False,
                        save_json=True, project=str(save_dir.parent), name=save_dir.name, exist_ok=True,
                        verbose=False, workers=cfg.workers)
    names = data["names"]
    per_class = {n: {"AP50": None, "AP50-95": None} for n in names}  # None: class absent from this split
    for k, c in enumerate(metrics.box.ap_class_index):
        per_class[names[int(c)]] = {"AP50": float(metrics.box.ap50[k]), "AP50-95": float(metrics.box.ap[k])}
    total, trainable = param_counts(model.model, frozen)
    report = {"mAP50": float(metrics.box.map50), "mAP50-95": float(metrics.box.map),
              "coco_mAP50": None, "coco_mAP50-95": None, "per_class": per_class,
              "params_total": total, "params_trainable": trainable, "imgsz": imgsz, "weights": str(Path(weights).resolve()),
              "save_dir": str(save_dir), "images_skipped": len(skipped), "skipped_images": skipped}
    sidecar = _sidecar_for(data_yaml, split, coco_json, names, split_dir(data_yaml, data, split))
    if sidecar is not None and skipped:  # pycocotools scores the same pages Ultralytics saw
        gone = {Path(item["image"]).stem for item in skipped}
        sidecar["image_ids"] = {stem: i for stem, i in sidecar["image_ids"].items() if stem not in gone}
    if cfg.val.coco and sidecar is not None:
        pred_file = save_dir / "predictions.json"
        preds = json.loads(pred_file.read_text()) if pred_file.is_file() else []
        coco = coco_eval(preds, sidecar, names)
        report["coco_mAP50"], report["coco_mAP50-95"] = coco["coco_mAP50"], coco["coco_mAP50-95"]
        for n, ap in coco["per_class"].items():
            per_class[n].update({"coco_AP50": ap["AP50"], "coco_AP50-95": ap["AP50-95"]})
    (save_dir / "report.json").write_text(json.dumps(report, indent=1))
    return report
