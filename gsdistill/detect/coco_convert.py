"""COCO detection jsons (any COCO file, the DocLayNet and PubLayNet releases) -> the Ultralytics layout.

Uses the shared writer of :mod:`gsdistill.detect.yolo_folder` (labels, image links, ``manifest.json``,
``coco_eval.json``). pycocotools later scores against ``coco/<split>.json``: the boxes the labels
hold (clipped to the image, dropped ones left out), with the source json's image and category ids.
"""
from __future__ import annotations

import json
from pathlib import Path

from gsdistill.tuples.labels import DOCLAYNET_CLASSES, PUBLAYNET_CLASSES
from gsdistill.detect.coco_checks import annotation_box, annotation_what, category_classes, image_table, size_mismatch
from gsdistill.detect.yolo_folder import SPLITS, DatasetError, _class_index, _Writer, assign_splits, clip_box, yolo_line
from gsdistill.detect.convert_output import claim, conversion_output


def coco_to_yolo(coco_json: str | Path, images_dir: str | Path, out_dir: str | Path, names: list[str],
                 split: str | None = None, val_fraction: float = 0.2, seed: int = 0,
                 category_map: dict | None = None, missing_images: str = "error", overwrite: bool = False) -> Path:
    """Convert one COCO detection json; return the data YAML path.

    ``split`` puts every image in that split (call once per official split file; other splits of
    ``out_dir`` stay); None splits the images at random (seeded) with ``val_fraction`` into val and
    replaces the folder's conversion. Categories are matched to ``names`` by name (case-insensitive)
    after ``category_map`` (source name -> target name, or None to drop; the drops are counted). A
    category outside ``names`` and the map is an error, as is a missing image unless
    ``missing_images="skip"`` (then recorded in the manifest), and every malformed entry
    (:mod:`gsdistill.detect.coco_checks`). ``out_dir`` holding a conversion of another json is
    refused unless ``overwrite`` (:mod:`gsdistill.detect.convert_output`).
    """
    coco_json, images_dir = Path(coco_json), Path(images_dir)
    with conversion_output(out_dir, [("--coco", coco_json), ("--images", images_dir)]) as out:
        plan = _plan(coco_json, images_dir, names, split, val_fraction, seed, category_map, missing_images)
        return _write(plan, out, names, split, overwrite)


def _plan(coco_json: Path, images_dir: Path, names, split, val_fraction, seed, category_map, missing_images) -> dict:
    """Everything to write, every entry checked, nothing written yet."""
    try:
        coco = json.loads(coco_json.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"{coco_json}: cannot read COCO json ({e})") from None
    for key in ("images", "annotations", "categories"):
        if not isinstance(coco, dict) or not isinstance(coco.get(key), list):
            raise DatasetError(f"{coco_json}: not a COCO detection file (no '{key}' list)")
    cat_class = category_classes(coco_json, coco["categories"], _class_index(names, category_map), names)
    images = image_table(coco_json, coco["images"])
    per_image: dict = {}
    unknown = []
    for k, ann in enumerate(coco["annotations"]):
        box = annotation_box(coco_json, ann, k)
        if ann["category_id"] not in cat_class:
            raise DatasetError(f"{coco_json}: {annotation_what(ann, k)} has category id {ann['category_id']} "
                               "missing from 'categories'")
        if ann["image_id"] not in images:
            unknown.append(ann.get("id", f"annotations[{k}]"))
            continue
        per_image.setdefault(ann["image_id"], []).append((annotation_what(ann, k), ann, box))
    splits = [split] if split else ["train", "val"]
    split_of = assign_splits((i["file_name"] for i in images.values()), val_fraction, seed) if not split else {}
    # json category id of each class (first source category mapped to it) for pycocotools
    class_cat = {c: cid for cid, c in reversed(list(cat_class.items())) if c is not None}
    merged = sum(c is not None for c in cat_class.values()) > len(class_cat)
    pages, skips = [], []
    for img in images.values():
        s = split or split_of[img["file_name"]]
        src = images_dir / img["file_name"]
        if not src.is_file():
            if missing_images == "skip":
                skips.append((s, str(src), "image file missing"))
                continue
            raise DatasetError(f"{coco_json}: image '{img['file_name']}' (id {img['id']}) not found at {src}")
        size_mismatch(coco_json, img, src)
        lines, anns, clipped = [], [], []
        for what, ann, (x, y, w, h) in per_image.get(img["id"], []):
            cls = cat_class[ann["category_id"]]
            what = f"{img['file_name']} ann {ann.get('id')}" if "id" in ann else f"{img['file_name']} {what}"
            if cls is None:
                skips.append((s, what, "category mapped to drop"))
                continue
            if w <= 0 or h <= 0:  # not a COCO box; flipping it would guess which corner is wrong
                kind = "negative" if min(w, h) < 0 else "zero"
                skips.append((s, what, f"{kind} width or height in bbox {ann['bbox']}"))
                continue
            box = clip_box([x, y, x + w, y + h], img["width"], img["height"])
            if box is None:
                skips.append((s, what, "box without area after clipping"))
                continue
            if box != (x, y, x + w, y + h):
                clipped.append((s, what, [x, y, x + w, y + h], box))
            lines.append(yolo_line(cls, box, img["width"], img["height"]))
            anns.append({**ann, "category_id": cls + 1 if merged else ann["category_id"],
                         "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                         "area": (box[2] - box[0]) * (box[3] - box[1])})
        if not lines:
            skips.append((s, img["file_name"], "no usable box (an empty label file would be background)"))
            continue
        pages.append((s, src, img, lines, anns, clipped))
    if merged:  # several source categories -> one class: ids are class index + 1
        cats = [{"id": i + 1, "name": n} for i, n in enumerate(names)]
        cat_ids = list(range(1, len(names) + 1))
    else:
        cats = [c for c in coco["categories"] if cat_class[c["id"]] is not None]
        cats = list({c["id"]: c for c in cats}.values())  # a repeated definition once
        cat_ids = [class_cat.get(c) for c in range(len(names))]
    return {"json": coco_json, "splits": splits, "pages": pages, "skips": skips, "unknown": unknown,
            "cats": cats, "cat_ids": cat_ids}


def _write(plan: dict, out: Path, names: list[str], split: str | None, overwrite: bool) -> Path:
    source = str(plan["json"].resolve())
    writer = _Writer(out, names, {s: source for s in plan["splits"]}, whole=split is None, overwrite=overwrite)
    if plan["unknown"]:  # recorded, and counted on the console by `detect convert`
        writer.manifest.setdefault("unknown_image_annotations", {})[str(plan["json"])] = {
            "count": len(plan["unknown"]), "annotation_ids": plan["unknown"][:100]}
    for s in plan["splits"]:
        writer.start_split(s)
    for s, what, reason in plan["skips"]:
        writer.skip(s, what, reason)
    ids: dict[str, dict] = {s: {} for s in plan["splits"]}
    trained: dict[str, dict] = {s: {"images": [], "annotations": []} for s in plan["splits"]}
    for s, src, img, lines, anns, clipped in plan["pages"]:
        for item in clipped:
            writer.clipped(*item)
        writer.add(s, src.stem, lines, src)
        ids[s][src.stem] = img["id"]
        trained[s]["images"].append(img)
        trained[s]["annotations"].extend(anns)
    # pycocotools scores against the boxes the labels hold (clipped, dropped ones left out), not the source json
    for s in plan["splits"]:
        path = writer.out / "coco" / f"{s}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**trained[s], "categories": plan["cats"], "source": source}))
        writer.sidecar[s] = {"coco_json": str(path.resolve()), "image_ids": ids[s], "category_ids": plan["cat_ids"]}
    return writer.finish()


def convert_release(root: str | Path, dataset: str, out_dir: str | Path, names: list[str] | None = None,
                    category_map: dict | None = None, missing_images: str = "error", overwrite: bool = False) -> Path:
    """Convert an official DocLayNet or PubLayNet release folder; return the data YAML path.

    DocLayNet core: ``root/COCO/{train,val,test}.json`` with images in ``root/PNG/``.
    PubLayNet: ``root/{train,val}.json`` with images in ``root/{train,val}/``. Every split file is
    checked before the first label is written; the release replaces the folder's conversion of the
    same files, and one of other data only with ``overwrite``.
    """
    root = Path(root)
    if dataset == "doclaynet":
        pairs = [(s, root / "COCO" / f"{s}.json", root / "PNG") for s in SPLITS]
        names = names or list(DOCLAYNET_CLASSES)
    elif dataset == "publaynet":
        pairs = [(s, root / f"{s}.json", root / s) for s in ("train", "val")]
        names = names or PUBLAYNET_CLASSES
    else:
        raise DatasetError(f"dataset '{dataset}' must be 'doclaynet' or 'publaynet'")
    found = [(s, j, d) for s, j, d in pairs if j.is_file()]
    if not found:
        raise DatasetError(f"{root}: no {dataset} split files found (looked for {[str(j) for _, j, _ in pairs]})")
    with conversion_output(out_dir, [("--release", root)]) as out:
        plans = [(s, _plan(j, d, names, s, 0.0, 0, category_map, missing_images)) for s, j, d in found]
        claim(out, names, {s: str(plan["json"].resolve()) for s, plan in plans}, whole=True, overwrite=overwrite)
        for s, plan in plans:
            path = _write(plan, out, names, s, overwrite=False)
    return path
