"""Layout prediction on PDFs, images or folders: one JSON of boxes and one drawn PNG per page.

Drawing uses PIL's built-in font (Ultralytics' annotator would fetch Arial.ttf from the network).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

os.environ.setdefault("YOLO_OFFLINE", "1")

from PIL import Image, ImageDraw, UnidentifiedImageError  # noqa: E402
from tqdm import tqdm  # noqa: E402

from gsdistill.detect.convert import IMAGE_SUFFIXES  # noqa: E402

PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#9a6324",
           "#469990", "#800000", "#000075", "#808000"]


def iter_pages(source: str | Path, dpi: int = 100) -> Iterator[tuple[str, Image.Image]]:
    """(page name, RGB image) for a PDF (every page), an image, or a folder of those (sorted)."""
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"predict: {source} does not exist")
    files = sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES + (".pdf",)) \
        if source.is_dir() else [source]
    if not files:
        raise ValueError(f"predict: {source} holds no PDF or image files ({', '.join(IMAGE_SUFFIXES)}, .pdf)")
    for path in files:
        suffix = path.suffix.lower()
        if suffix == ".pdf":
            import pymupdf as fitz

            try:
                doc = fitz.open(path)
            except (fitz.FileDataError, RuntimeError) as e:
                raise ValueError(f"predict: {path} is not a readable PDF ({e})") from None
            with doc:
                for i, page in enumerate(doc):
                    pix = page.get_pixmap(dpi=dpi, alpha=False)
                    yield f"{path.stem}_p{i:04d}", Image.frombytes("RGB", (pix.width, pix.height), pix.samples)
        elif suffix in IMAGE_SUFFIXES:
            try:
                with Image.open(path) as im:
                    yield path.stem, im.convert("RGB")
            except (UnidentifiedImageError, OSError) as e:
                raise ValueError(f"predict: {path} is not a readable image ({e})") from None
        else:
            raise ValueError(f"predict: {path} is neither a PDF nor an image ({', '.join(IMAGE_SUFFIXES)})")


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


def predict(weights: str | Path, source: str | Path, out_dir: str | Path, cfg) -> list[Path]:
    """Detect layout boxes on every page of ``source``; write ``<page>.json`` + ``<page>.png``; return the JSONs."""
    from gsdistill.detect.evaluate import checkpoint_imgsz
    from gsdistill.detect.safe_load import load_yolo
    from gsdistill.output_folder import lock_folder

    out = _check_out(Path(out_dir), Path(source))
    model = load_yolo(weights, safe=bool(cfg.safe_load))  # registers the gsdistill layers before unpickling
    imgsz = checkpoint_imgsz(model, cfg.predict.imgsz, cfg.imgsz)
    with lock_folder(out):  # a second predict into the same folder: refused with the holder's PID
        return _predict(model, imgsz, weights, source, out, cfg)


def _check_out(out: Path, source: Path) -> Path:
    """``out`` unless writing there would replace or add to the pages read: a folder source must not
    be or hold ``out`` (drawn PNGs would overwrite same-named pages and be read next time), and an
    image source must not be the ``<page>.png`` / ``<page>.json`` written for it."""
    from gsdistill.output_folder import OutputConflict, check_output_dir
    check_output_dir(out, "predict.out")
    src, dst = source.resolve(), out.resolve()
    if source.is_dir() and (dst == src or src in dst.parents):
        raise OutputConflict(f"predict.out {out}: is or lies in the source folder {source}; the drawn pages would "
                             "replace same-named pages there: give a folder outside it")
    if source.is_file() and src in {(out / f"{source.stem}{s}").resolve() for s in (".png", ".json")}:
        raise OutputConflict(f"predict.out {out}: the drawn page would replace the source {source}; give another "
                             "predict.out")
    return out


def _predict(model, imgsz: int, weights, source, out: Path, cfg) -> list[Path]:
    from gsdistill.detect.pipeline import resolve_device

    names = model.names
    written = []
    for name, image in tqdm(iter_pages(source, dpi=int(cfg.predict.dpi)), desc="predict", unit="page"):
        result = model.predict(image, imgsz=imgsz, conf=cfg.predict.conf, max_det=cfg.predict.max_det,
                               device=resolve_device(cfg.device), verbose=False)[0]
        boxes = [{"category": names[int(c)], "class_id": int(c), "score": round(float(s), 4),
                  "bbox": [round(float(v), 1) for v in xyxy]}
                 for xyxy, s, c in zip(result.boxes.xyxy.tolist(), result.boxes.conf.tolist(),
                                       result.boxes.cls.tolist())]
        record = {"page": name, "source": str(source), "width": image.width, "height": image.height,
                  "weights": str(weights), "imgsz": imgsz,
                  "boxes": boxes}
        path = out / f"{name}.json"
        path.write_text(json.dumps(record, indent=1))
        draw_boxes(image, boxes).save(out / f"{name}.png")
        written.append(path)
    return written
