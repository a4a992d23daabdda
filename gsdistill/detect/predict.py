"""Layout prediction on PDFs, images or folders: one JSON of boxes and one drawn PNG per page (named,
and checked against earlier predictions in the folder, by :mod:`gsdistill.detect.predict_output`).

Drawing uses PIL's built-in font (Ultralytics' annotator would fetch Arial.ttf from the network).
"""
from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Iterator

os.environ.setdefault("YOLO_OFFLINE", "1")

from PIL import Image, ImageDraw, UnidentifiedImageError  # noqa: E402
from tqdm import tqdm  # noqa: E402

from gsdistill.detect.predict_output import PlannedPage, clear_earlier, plan_pages  # noqa: E402
from gsdistill.output_folder import OutputConflict  # noqa: E402

PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324",
           "#469990", "#800000", "#000075", "#808000"]


def iter_pages(source: str | Path, dpi: int = 100) -> Iterator[tuple[str, Image.Image]]:
    """(page name, RGB image) for a PDF (every page), an image, or a folder of those (sorted); the
    names are the output names of :func:`~gsdistill.detect.predict_output.plan_pages`."""
    return render_pages(plan_pages(Path(source)), dpi)


def render_pages(pages: list[PlannedPage], dpi: int) -> Iterator[tuple[str, Image.Image]]:
    """(name, RGB image) of each planned page, each PDF opened once."""
    for path, group in itertools.groupby(pages, key=lambda p: p.file):
        group = list(group)
        if group[0].index is None:
            try:
                with Image.open(path) as im:
                    yield group[0].name, im.convert("RGB")
            except (UnidentifiedImageError, OSError) as e:
                raise ValueError(f"predict: {path} is not a readable image ({e})") from None
            continue
        import pymupdf as fitz

        with fitz.open(path) as doc:
            for page in group:
                pix = doc[page.index].get_pixmap(dpi=dpi, alpha=False)
                yield page.name, Image.frombytes("RGB", (pix.width, pix.height), pix.samples)


def draw_boxes(image: Image.Image, boxes: list[dict]) -> Image.Image:
    """A copy of ``image`` with each box outlined and labelled ``category score``."""
    out = image.copy()
    draw = ImageDraw.Draw(out)
    for b in boxes:
        color = PALETTE[b["class_id"] % len(PALETTE)]
        draw.rectangle(b["bbox"], outline=color, width=2)
        x0, y0 = b["bbox"][0], max(0.0, b["bbox"][1] - 11)
        label = f"{b['category']} {b['score']:.2f}"
        draw.rectangle(draw.textbbox((x0, y0), label), fill=color)
        draw.text((x0, y0), label, fill="white")
    return out


def predict(weights: str | Path, source: str | Path, out_dir: str | Path, cfg, overwrite: bool = False) -> list[Path]:
    """Detect layout boxes on every page of ``source``; write ``<page>.json`` + ``<page>.png``; return the JSONs.

    Page names and what happens to earlier predictions in ``out_dir`` (replaced when they are of the
    same source and weights; otherwise refused unless ``overwrite``): :mod:`gsdistill.detect.predict_output`.
    """
    from gsdistill.detect.evaluate import checkpoint_imgsz
    from gsdistill.detect.safe_load import load_yolo
    from gsdistill.output_folder import lock_folder
    from gsdistill.tuples.store.folder import removed_if_left_empty

    source, weights = Path(source), Path(weights)
    out = _check_out(Path(out_dir), source, weights)
    pages = plan_pages(source)  # every name, before the model loads: a clash or a broken PDF is one line
    model = load_yolo(weights, safe=bool(cfg.safe_load))  # registers the gsdistill layers before unpickling
    imgsz = checkpoint_imgsz(model, cfg.predict.imgsz, cfg.imgsz)
    # a second predict into the same folder: refused with the holder's PID
    with removed_if_left_empty(out), lock_folder(out):
        clear_earlier(out, source, weights, pages, overwrite)
        return _predict(model, imgsz, weights, source, pages, out, cfg)


def _check_out(out: Path, source: Path, weights: Path | None = None) -> Path:
    """``out`` unless writing there would replace or add to the pages read: a folder source must not
    be or hold ``out`` (drawn PNGs would overwrite same-named pages and be read next time), and an
    image source must not be the ``<page>.png`` / ``<page>.json`` written for it; ``out`` holds
    neither the source nor the weights (an input is never inside an output)."""
    from gsdistill.output_folder import check_output_dir
    src, dst = source.resolve(), out.resolve()
    inputs = [] if (source.is_dir() and (dst == src or src in dst.parents)) else [("source", source)]
    inputs += [("weights", weights)] if weights is not None else []
    if not (source.is_file() and src in {(out / f"{source.stem}{s}").resolve() for s in (".png", ".json")}):
        check_output_dir(out, "predict.out", inputs)
    else:
        check_output_dir(out, "predict.out")
    src, dst = source.resolve(), out.resolve()
    if source.is_dir() and (dst == src or src in dst.parents):
        raise OutputConflict(f"predict.out {out}: is or lies in the source folder {source}; the drawn pages would "
                             "replace same-named pages there: give a folder outside it")
    if source.is_file() and src in {(out / f"{source.stem}{s}").resolve() for s in (".png", ".json")}:
        raise OutputConflict(f"predict.out {out}: the drawn page would replace the source {source}; give another "
                             "predict.out")
    return out


def _predict(model, imgsz: int, weights: Path, source: Path, pages: list[PlannedPage], out: Path, cfg) -> list[Path]:
    from gsdistill.detect.device_string import resolve_device

    names = model.names
    written = []
    for name, image in tqdm(render_pages(pages, dpi=int(cfg.predict.dpi)), total=len(pages), desc="predict",
                            unit="page"):
        result = model.predict(image, imgsz=imgsz, conf=cfg.predict.conf, max_det=cfg.predict.max_det,
                               device=resolve_device(cfg.device), verbose=False)[0]
        boxes = [{"category": names[int(c)], "class_id": int(c), "score": round(float(s), 4),
                  "bbox": [round(float(v), 1) for v in xyxy]}
                 for xyxy, s, c in zip(result.boxes.xyxy.tolist(), result.boxes.conf.tolist(),
                                       result.boxes.cls.tolist())]
        # source and weights as absolute paths: how a later run into this folder recognises the page
        record = {"page": name, "source": str(source.resolve()), "weights": str(weights.resolve()),
                  "width": image.width, "height": image.height, "imgsz": imgsz, "boxes": boxes}
        path = out / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
        draw_boxes(image, boxes).save(path.with_suffix(".png"))
        written.append(path)
    return written
