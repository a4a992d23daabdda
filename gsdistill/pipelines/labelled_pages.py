"""``gsdistill demo --coco``'s data: a user's labelled pages split by document, pretrained on as
unlabelled scans, their boxes kept for the detection heads alone.

1. The images are copied (never altered in place) at two sizes into a cache keyed by their bytes:
   ``ocr_long_side`` for OCR, ``detect_long_side`` for detection (Ultralytics would
   decode a 20-megapixel scan every epoch otherwise). Only downscaled: Tesseract is slower, not
   better, on an upscaled scan.
2. The OCR copies are built into page tuples by the images builder (``--from images``, Tesseract in
   ``ocr_lang``), into the cache too, keyed by the images' bytes and the OCR settings: a second demo
   (another seed, another class map) reuses the pages, the builder resuming what an interrupted one
   left. The builder reads the image files only: no box, category or field of the COCO file reaches a
   page tuple, its descriptors or its views.
3. Whole documents (``labelled_input.documents``) are held out (``data.eval_fraction``); the pages of
   each side are copied to ``data/train`` and ``data/eval`` with their document as ``doc_id``, downscaled
   to ``pretrain_long_side`` (boxes with them).
4. The detection data: the same split's boxes, mapped to the target classes, converted by
   ``detect.coco_convert.convert_release`` (a DocLayNet-layout folder of two split files).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gsdistill.config import load_config
from gsdistill.errors import InputError, MissingFileError
from gsdistill.pipelines import labelled_input as li
from gsdistill.pipelines.labelled_input import copy_name


def cache_root(cfg) -> Path:
    if cfg.labelled.cache_dir:
        return Path(cfg.labelled.cache_dir)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gsdistill" / "demo_labelled"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def images_key(images: list[dict]) -> str:
    """The images' names and bytes, in one key."""
    h = hashlib.sha256()
    for im in sorted(images, key=lambda im: im["name"]):
        h.update(im["name"].encode() + b"\0" + hashlib.sha256(im["file"].read_bytes()).digest())
    return h.hexdigest()[:16]


def _copy_one(job: tuple[str, list[tuple[Path, int | None]]]) -> tuple[int, int]:
    """One image's downscaled copies (skipped when present); its size at full scale."""
    from PIL import Image

    from gsdistill.tuples.sources.images import load_image
    src, targets = job
    todo = [(path, side) for path, side in targets if not path.is_file()]
    with Image.open(src) as im:
        size = im.size
    if todo:
        image = load_image(src)[0].convert("L")  # scans are grey; the builder makes RGB of it
        for path, side in todo:
            s = min(1.0, side / max(size)) if side else 1.0
            out = image if s == 1.0 else image.resize((round(size[0] * s), round(size[1] * s)), Image.Resampling.LANCZOS)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp.png")
            out.save(tmp)
            tmp.replace(path)  # a copy is whole or absent: an interrupted run makes it again
    return size


def make_copies(images: list[dict], folders: list[tuple[Path, int | None]], workers: int) -> None:
    """Every image downscaled to each ``(folder, long side or None = as it is)``, ``workers`` at a time;
    records each image's full size as ``im["size"]``."""
    jobs = [(str(im["file"]), [(f / copy_name(im["name"]), side) for f, side in folders]) for im in images]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            sizes = list(pool.map(_copy_one, jobs, chunksize=4))
    else:
        sizes = [_copy_one(j) for j in jobs]
    for im, size in zip(images, sizes):
        im["size"] = size


def ocr_pages(cfg, images: list[dict], root: Path, workers: int) -> tuple[Path, dict]:
    """The page tuples of the OCR copies (built or found in the cache) and what it took."""
    from gsdistill.tuples.builder.driver import build_shards
    from gsdistill.tuples.store.reader import read_manifest

    lab = cfg.labelled
    ocr_keys = [f"ocr.lang={lab.ocr_lang}", f"ocr.min_width={int(lab.ocr_min_width)}"]
    tcfg = load_config("tuples", None, ocr_keys)
    settings = {"long_side": lab.ocr_long_side, **{k: tcfg.ocr[k] for k in ("lang", "psm", "min_conf", "min_width")}}
    folder = root / f"ocr-{_digest(json.dumps(settings, sort_keys=True))}"
    scans, pages = folder / "scans", folder / "pages"
    (folder / "settings.json").parent.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(json.dumps(settings))
    cached = (pages / "manifest.json").is_file()
    t0 = time.time()
    make_copies(images, [(scans, lab.ocr_long_side)], workers)
    per_unit = max(1, math.ceil(len(images) / (4 * workers)))  # small units: the workers stay busy to the end
    tcfg = load_config("tuples", None, [*ocr_keys, f"build.workers={workers}", f"build.pages_per_shard={per_unit}",
                                        "build.progress=false"])
    t1 = time.time()
    build_shards("images", scans, pages, tcfg)
    manifest = read_manifest(pages)
    return pages, {"folder": str(folder), "settings": settings, "cached": cached, "workers": workers,
                   "copy_seconds": round(t1 - t0, 1), "ocr_seconds": round(time.time() - t1, 1),
                   "pages": manifest["pages"], "spans": manifest["spans"], "skipped": manifest["skipped_count"]}


def downscaled(page: dict, long_side: int | None) -> dict:
    """The page with its image's long side at most ``long_side`` and every box scaled with it: OCR wants
    ~300 dpi, a 112 px view of the whole page does not (a large image only costs each view's decode)."""
    from PIL import Image

    w, h = page["image"].size
    s = min(1.0, long_side / max(w, h)) if long_side else 1.0
    if s == 1.0:
        return page
    size = (round(w * s), round(h * s))
    scale = lambda items: [{**it, "bbox": [v * s for v in it["bbox"]]} for it in items]  # noqa: E731
    return {**page, "image": page["image"].resize(size, Image.Resampling.LANCZOS), "width": size[0], "height": size[1],
            "spans": scale(page["spans"]), "boxes": scale(page.get("boxes") or [])}


def write_side(pages_dir: Path, out: Path, doc_of_page: dict[str, str], docs: set[str], readers: int,
               long_side: int | None = None) -> dict:
    """The pages of ``docs`` into ``out``, each with its document as ``doc_id`` (at least ``readers`` shards),
    downscaled to ``long_side``."""
    from gsdistill.tuples.store.reader import ShardDataset, read_manifest
    from gsdistill.tuples.store.writer import write_shards

    ids = [p["id"] for p in ShardDataset(pages_dir, decode_images=False) if doc_of_page.get(p["id"]) in docs]

    def side():
        for page in ShardDataset(pages_dir):
            if doc_of_page.get(page["id"]) in docs:
                page.pop("_key", None)
                yield downscaled({**page, "doc_id": doc_of_page[page["id"]]}, long_side)

    write_shards(side(), out, pages_per_shard=max(1, math.ceil(len(ids) / max(1, readers))), progress=False)
    m = read_manifest(out)
    return {k: m[k] for k in ("pages", "documents", "spans", "boxes_per_class", "skipped_count", "skip_reasons")}


def _inputs(cfg) -> list[tuple[Path, Path]]:
    lab = cfg.labelled
    if lab.release:
        if not lab.dataset:
            raise InputError("--release needs --dataset doclaynet|publaynet")
        return li.release_inputs(lab.release, str(lab.dataset))
    if not lab.images:
        raise InputError(f"--coco {lab.coco}: name the folder of its images with --images DIR")
    if not Path(lab.images).is_dir():
        raise MissingFileError(f"--images {lab.images}: no such folder")
    return [(Path(lab.coco), Path(lab.images))]


def _capped(doc_of: dict[str, str], max_pages: int | None, seed: int) -> set[str]:
    """Whole documents, in a seeded order, up to ``max_pages`` pages (every document without a cap)."""
    import numpy as np

    docs = sorted(set(doc_of.values()))
    if max_pages is None:
        return set(docs)
    pages = {d: sum(v == d for v in doc_of.values()) for d in docs}
    keep, n = set(), 0
    for i in np.random.default_rng(seed).permutation(len(docs)):
        if n >= int(max_pages):
            break
        keep.add(docs[i])
        n += pages[docs[i]]
    return keep


def read_inputs(cfg) -> dict:
    """The labelled pages, their documents and classes, every input checked (one line, exit 2, before a
    stage runs: ``demo.check_demo_config`` calls it too)."""
    lab = cfg.labelled
    labelled = li.read_labelled(_inputs(cfg))
    how, doc_of = li.documents(labelled["images"], lab.doc_key)
    kept_docs = _capped(doc_of, lab.max_pages, int(cfg.seed))
    if len(kept_docs) < 2:
        raise InputError(f"{_inputs(cfg)[0][0]}: one document ({how}); the held-out split needs two or more")
    images = [im for im in labelled["images"] if doc_of[im["name"]] in kept_docs]
    mapping = li.class_map(lab.class_map, labelled["categories"])
    classes, class_info = li.target_classes(images, mapping, int(lab.min_class_boxes))
    return {"labelled": labelled, "how": how, "doc_of": doc_of, "kept_docs": kept_docs, "images": images,
            "mapping": mapping, "classes": classes, "class_info": class_info}


def build_labelled_split(cfg, out: Path, readers: int) -> tuple[Path, Path, dict]:
    """``out/data/{train,eval}`` (OCR page tuples, whole documents apart) and the detection data in
    ``out/detect/labelled``; the info the report shows."""
    from gsdistill.eval.splits import split_documents
    from gsdistill.pipelines.labelled_detect import detect_data

    lab, seed = cfg.labelled, int(cfg.seed)
    r = read_inputs(cfg)
    labelled, how, doc_of, kept_docs, images = r["labelled"], r["how"], r["doc_of"], r["kept_docs"], r["images"]
    mapping, classes, class_info = r["mapping"], r["classes"], r["class_info"]
    train_docs, held_docs = split_documents(kept_docs, float(cfg.data.eval_fraction), seed)
    workers = int(lab.workers or len(os.sched_getaffinity(0)))
    root = cache_root(cfg) / images_key(images)
    pages_dir, ocr = ocr_pages(cfg, images, root, workers)
    detect_copies = root / f"detect-{lab.detect_long_side}"
    make_copies(images, [(detect_copies, lab.detect_long_side)], workers)
    page_doc = {copy_name(im["name"]): doc_of[im["name"]] for im in images}
    train_dir, eval_dir = out / "data" / "train", out / "data" / "eval"
    side = lab.pretrain_long_side
    info = {"train": write_side(pages_dir, train_dir, page_doc, set(train_docs), readers, side),
            "eval": write_side(pages_dir, eval_dir, page_doc, set(held_docs), 1, side)}
    by_document = len(held_docs) >= int(lab.bootstrap_min_docs)
    data_yaml = detect_data(images, doc_of, set(held_docs), mapping, classes, detect_copies, lab.detect_long_side,
                            out / "detect" / "labelled", by_document)
    labelled_pages = {d: sum(doc_of[im["name"]] == d for im in images) for d in sorted(kept_docs)}
    info["labelled"] = {
        "inputs": [[str(j), str(d)] for j, d in _inputs(cfg)], "documents_by": how, "images": len(images),
        "documents": labelled_pages, "train_docs": train_docs, "held_docs": held_docs,
        "input_skipped": labelled["skipped"], "class_map": lab.class_map or "the set's own names",
        "classes": classes, **class_info, "min_class_boxes": int(lab.min_class_boxes), "ocr": ocr,
        "bootstrap_unit": "documents" if by_document else "pages within each document", "detect_long_side": lab.detect_long_side,
        "data_yaml": str(data_yaml)}
    return train_dir, eval_dir, info
