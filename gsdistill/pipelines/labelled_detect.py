"""The detection data of ``gsdistill demo --coco``: the labelled pages' own boxes on the demo's split.

Training pages: every labelled page of the pretraining side's documents; held-out pages: every one of the
held-out documents. Boxes are scaled to the detection copies (``labelled.detect_long_side``), mapped to
the target classes (``labelled_input.class_map``; dropped and too-rare classes left out, with counts),
written as a DocLayNet-layout folder (``COCO/{train,val}.json`` + ``PNG/``) and converted by
``detect.coco_convert.convert_release``, so pycocotools scores the held-out boxes as drawn.
"""
from __future__ import annotations

import json
from pathlib import Path

from gsdistill.pipelines.labelled_input import copy_name


def scaled_size(size: tuple[int, int], long_side: int | None) -> tuple[int, int]:
    """An image's size after the copy's downscaling (``labelled_pages._copy_one`` uses the same rule)."""
    s = min(1.0, long_side / max(size)) if long_side else 1.0
    return (size[0], size[1]) if s == 1.0 else (round(size[0] * s), round(size[1] * s))


def _split_json(images: list[dict], mapping: dict, classes: list[str], long_side: int | None) -> dict:

    index = {c: i + 1 for i, c in enumerate(classes)}
    out_images, anns = [], []
    for k, im in enumerate(images, start=1):
        (w, h), (sw, sh) = im["size"], scaled_size(im["size"], long_side)
        out_images.append({"id": k, "file_name": copy_name(im["name"]), "width": sw, "height": sh})
        for name, (x, y, bw, bh) in im["boxes"]:
            target = mapping[name]
            if target in index:
                fx, fy = sw / w, sh / h
                anns.append({"id": len(anns) + 1, "image_id": k, "category_id": index[target], "iscrowd": 0,
                             "bbox": [x * fx, y * fy, bw * fx, bh * fy], "area": bw * fx * bh * fy})
    return {"images": out_images, "annotations": anns,
            "categories": [{"id": i + 1, "name": c} for i, c in enumerate(classes)]}


def detect_data(images: list[dict], doc_of: dict[str, str], held: set[str], mapping: dict, classes: list[str],
                copies: Path, long_side: int | None, out: Path, by_document: bool) -> Path:
    """The data YAML of both sides in ``out/data`` (source files in ``out/source``). The held-out sidecar names
    each page's document: as ``doc_ids`` when ``by_document`` (the report's bootstrap resamples documents), else as
    ``strata`` (it resamples pages within each document)."""
    from gsdistill.detect.coco_convert import convert_release

    source = out / "source"
    (source / "COCO").mkdir(parents=True, exist_ok=True)
    png = source / "PNG"
    if png.is_symlink() or png.exists():
        png.unlink()
    png.symlink_to(Path(copies).resolve(), target_is_directory=True)
    for split, keep in (("train", False), ("val", True)):
        side = [im for im in images if (doc_of[im["name"]] in held) == keep]
        (source / "COCO" / f"{split}.json").write_text(json.dumps(_split_json(side, mapping, classes, long_side)))
    data_yaml = convert_release(source, "doclaynet", out / "data", names=classes, overwrite=True)
    sidecar_path = Path(data_yaml).parent / "coco_eval.json"
    sidecar = json.loads(sidecar_path.read_text())
    stem_doc = {Path(copy_name(im["name"])).stem: doc_of[im["name"]] for im in images}
    held_doc = {s: stem_doc[s] for s in sidecar["val"]["image_ids"]}
    # documents resampled when there are enough of them, else pages within each document (a stratified bootstrap)
    sidecar["val"]["doc_ids" if by_document else "strata"] = held_doc
    sidecar_path.write_text(json.dumps(sidecar))
    return Path(data_yaml)
