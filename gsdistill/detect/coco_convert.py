"""COCO detection jsons (any COCO file, the DocLayNet and PubLayNet releases) -> the Ultralytics layout.

Uses the shared writer of :mod:`gsdistill.detect.convert` (labels, image links, ``manifest.json``,
``coco_eval.json``). pycocotools later scores against ``coco/<split>.json``: the boxes the labels
hold (clipped to the image, dropped ones left out), with the source json's image and category ids.
"""
from __future__ import annotations

import json
from pathlib import Path

from gsdistill.tuples.labels import DOCLAYNET_CLASSES, PUBLAYNET_CLASSES
from gsdistill.detect.convert import SPLITS, DatasetError, _class_index, _Writer, assign_splits, clip_box, yolo_line


def coco_to_yolo(coco_json: str | Path, images_dir: str | Path, out_dir: str | Path, names: list[str],
                 split: str | None = None, val_fraction: float = 0.2, seed: int = 0,
                 category_map: dict | None = None, missing_images: str = "error") -> Path:
    """Convert one COCO detection json; return the data YAML path.

    ``split`` puts every image in that split (call once per official split file); None splits the
    images at random (seeded) with ``val_fraction`` into val. Categories are matched to ``names`` by
    name (case-insensitive) after ``category_map`` (source name -> target name, or None to drop; the
    drops are counted). A category outside ``names`` and the map is an error, as is a missing image
    unless ``missing_images="skip"`` (then recorded in the manifest).
    """
    coco_json, images_dir = Path(coco_json), Path(images_dir)
    try:
        coco = json.loads(coco_json.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"{coco_json}: cannot read COCO json ({e})") from None
    for key in ("images", "annotations", "categories"):
        if key not in coco:
            raise DatasetError(f"{coco_json}: not a COCO detection file (no '{key}')")
    index = _class_index(names, category_map)
    cat_class = {}
    for cat in coco["categories"]:
        if cat["name"].lower() not in index:
            raise DatasetError(f"{coco_json}: category '{cat['name']}' (id {cat['id']}) is not one of the "
                               f"classes {names}; map it with category_map (None drops it)")
        cat_class[cat["id"]] = index[cat["name"].lower()]
    per_image: dict[int, list] = {}
    image_ids = {img["id"] for img in coco["images"]}
    unknown = []
    for ann in coco["annotations"]:
        if ann["category_id"] not in cat_class:
            raise DatasetError(f"{coco_json}: annotation {ann.get('id')} has category id {ann['category_id']} "
                               "missing from 'categories'")
        if ann["image_id"] not in image_ids:
            unknown.append(ann.get("id"))
            continue
        per_image.setdefault(ann["image_id"], []).append(ann)
    writer = _Writer(out_dir, names)
    if unknown:  # recorded, never silently dropped
        writer.manifest.setdefault("unknown_image_annotations", {})[str(coco_json)] = {
            "count": len(unknown), "annotation_ids": unknown[:100]}
    splits = [split] if split else ["train", "val"]
    for s in splits:
        writer.start_split(s)
    # json category id of each class (first source category mapped to it) for pycocotools
    class_cat = {c: cid for cid, c in reversed(list(cat_class.items())) if c is not None}
    merged = sum(c is not None for c in cat_class.values()) > len(class_cat)
    ids: dict[str, dict] = {s: {} for s in splits}
    trained: dict[str, dict] = {s: {"images": [], "annotations": []} for s in splits}
    split_of = assign_splits((i["file_name"] for i in coco["images"]), val_fraction, seed) if not split else {}
    for img in coco["images"]:
        s = split or split_of[img["file_name"]]
        src = images_dir / img["file_name"]
        if not src.is_file():
            if missing_images == "skip":
                writer.skip(s, str(src), "image file missing")
                continue
            raise DatasetError(f"{coco_json}: image '{img['file_name']}' (id {img['id']}) not found at {src}")
        lines, anns = [], []
        for ann in per_image.get(img["id"], []):
            cls = cat_class[ann["category_id"]]
            x, y, w, h = (float(v) for v in ann["bbox"])
            what = f"{img['file_name']} ann {ann.get('id')}"
            if cls is None:
                writer.skip(s, what, "category mapped to drop")
                continue
            if w < 0 or h < 0:  # not a COCO box; flipping it would guess which corner is wrong
                writer.skip(s, what, f"negative width or height in bbox {ann['bbox']}")
                continue
            box = clip_box([x, y, x + w, y + h], img["width"], img["height"])
            if box is None:
                writer.skip(s, what, "box without area after clipping")
                continue
            if box != (x, y, x + w, y + h):
                writer.clipped(s, what, [x, y, x + w, y + h], box)
            lines.append(yolo_line(cls, box, img["width"], img["height"]))
            anns.append({**ann, "category_id": cls + 1 if merged else ann["category_id"],
                         "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                         "area": (box[2] - box[0]) * (box[3] - box[1])})
        if not lines:
            writer.skip(s, img["file_name"], "no usable box (an empty label file would be background)")
            continue
        writer.add(s, src.stem, lines, src)
        ids[s][src.stem] = img["id"]
        trained[s]["images"].append(img)
        trained[s]["annotations"].extend(anns)
    # pycocotools scores against the boxes the labels hold (clipped, dropped ones left out), not the source json
    if merged:  # several source categories -> one class: ids are class index + 1
        cats = [{"id": i + 1, "name": n} for i, n in enumerate(names)]
        cat_ids = list(range(1, len(names) + 1))
    else:
        cats = [c for c in coco["categories"] if cat_class[c["id"]] is not None]
        cat_ids = [class_cat.get(c) for c in range(len(names))]
    for s in splits:
        path = writer.out / "coco" / f"{s}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**trained[s], "categories": cats, "source": str(coco_json.resolve())}))
        writer.sidecar[s] = {"coco_json": str(path.resolve()), "image_ids": ids[s], "category_ids": cat_ids}
    return writer.finish()


def convert_release(root: str | Path, dataset: str, out_dir: str | Path, names: list[str] | None = None,
                    category_map: dict | None = None, missing_images: str = "error") -> Path:
    """Convert an official DocLayNet or PubLayNet release folder; return the data YAML path.

    DocLayNet core: ``root/COCO/{train,val,test}.json`` with images in ``root/PNG/``.
    PubLayNet: ``root/{train,val}.json`` with images in ``root/{train,val}/``.
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
    for s, j, d in found:
        path = coco_to_yolo(j, d, out_dir, names, split=s, category_map=category_map, missing_images=missing_images)
    return path
