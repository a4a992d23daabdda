"""Page images without a text layer (scans, renders) -> page tuples through OCR.

The OCR engine is one pluggable function ``ocr_fn(image: PIL.Image) -> list[span]``, each span
``{"text": str, "bbox": [x0, y0, x1, y1] (pixels), "group": hashable | None}``; consecutive spans
with the same ``group`` are joined into one page span (the default engine returns words grouped
by Tesseract paragraph, so a page span is a paragraph). ``tesseract_ocr`` is the default, through
pytesseract's ``image_to_data`` (Tesseract's TSV output).

Layout boxes of an OCRed page come from the text alone, so they are weak labels: every paragraph
is a box; it is a Caption when it starts with "Figure/Table N:", a List-item when it starts with
a bullet or enumeration, a Section-header when it has at most 2 lines whose height is >= 1.3 x
the page's median line height, else Text.

``load_image`` turns every image mode into 8-bit RGB (grayscale, palette, alpha over white,
CMYK, 16-bit and float images rescaled) and raises ``DataError`` for unreadable files.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import statistics
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from PIL import Image, ImageSequence, UnidentifiedImageError

from gsdistill.tuples.errors import DataError, SkipLog, ensure_log
from gsdistill.tuples.sources.pdf_layout import BULLET, CAPTION

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp", ".gif"}
OcrFn = Callable[[Image.Image], list]


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> 8-bit RGB (16-bit/32-bit/float rescaled by their range, alpha over white)."""
    if img.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max(initial=0) > 255 else 255.0
        if img.mode == "F":
            top = 1.0 if arr.max(initial=0) <= 1.0 else max(arr.max(), 1.0)
        arr = np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(arr, "L").convert("RGB")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "RGB" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def load_image(path: str | Path, max_pixels: int = 100_000_000) -> list[Image.Image]:
    """Every frame of an image file as RGB (one for most formats); ``DataError`` when unreadable."""
    path = Path(path)
    try:
        with Image.open(path) as img:
            if img.width * img.height > max_pixels:
                raise DataError(f"{path}: huge image {img.width}x{img.height} > max_pixels {max_pixels}")
            frames = []
            for frame in ImageSequence.Iterator(img):
                frame.load()
                frames.append(to_rgb(frame))
            return frames
    except DataError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise DataError(f"{path}: unreadable image ({type(e).__name__}: {e})") from None


def tesseract_available() -> bool:
    return shutil.which("tesseract") is not None


@contextlib.contextmanager
def _tesseract_thread_limit():
    """``OMP_THREAD_LIMIT=1`` for the Tesseract child process only (on shared CPUs its OpenMP pool mostly
    spins). Left in this process's environment it reached every process started later, and torch's bf16
    CPU kernels under ``OMP_THREAD_LIMIT`` return NaN (measured: ``tools/gpu_check.sh --cpu``, issue 22)."""
    before = os.environ.get("OMP_THREAD_LIMIT")
    os.environ["OMP_THREAD_LIMIT"] = before or "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["OMP_THREAD_LIMIT"]


def tesseract_ocr(image: Image.Image, lang: str = "eng", psm: int = 3, min_conf: float = 30.0,
                  min_width: int = 1200) -> list[dict]:
    """Words from Tesseract (``image_to_data``), grouped by (block, paragraph), confidence >= min_conf.

    Images narrower than ``min_width`` are upscaled first (Tesseract is trained on ~300 dpi text;
    72 dpi page renders such as PubLayNet's lose most words otherwise); boxes are mapped back.
    """
    import pytesseract
    if not tesseract_available():
        raise DataError("OCR needs the 'tesseract' program (Debian: apt install tesseract-ocr); not found on PATH")
    scale = max(1.0, min_width / max(image.width, 1))
    if scale > 1.0:
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.LANCZOS)
    with _tesseract_thread_limit():
        data = pytesseract.image_to_data(image, lang=lang, config=f"--psm {psm}", output_type=pytesseract.Output.DICT)
    words = []
    for i, text in enumerate(data["text"]):
        text = (text or "").strip()
        if not text or float(data["conf"][i]) < min_conf:
            continue
        x, y, w, h = (int(data[k][i]) / scale for k in ("left", "top", "width", "height"))
        words.append({"text": text, "bbox": [round(x, 2), round(y, 2), round(x + w, 2), round(y + h, 2)],
                      "group": (data["block_num"][i], data["par_num"][i]), "line": data["line_num"][i]})
    return words


def make_tesseract(lang: str = "eng", psm: int = 3, min_conf: float = 30.0, min_width: int = 1200) -> OcrFn:
    return partial(tesseract_ocr, lang=lang, psm=psm, min_conf=min_conf, min_width=min_width)


def group_words(words: list[dict]) -> list[dict]:
    """Consecutive OCR spans with the same group -> one span (text joined, box united, line count)."""
    out: list[dict] = []
    for w in words:
        g = w.get("group")
        if out and g is not None and out[-1]["group"] == g:
            cur = out[-1]
            cur["text"] += " " + w["text"]
            cur["bbox"] = [min(cur["bbox"][0], w["bbox"][0]), min(cur["bbox"][1], w["bbox"][1]),
                           max(cur["bbox"][2], w["bbox"][2]), max(cur["bbox"][3], w["bbox"][3])]
            cur["lines"].add(w.get("line"))
        else:
            out.append({"text": w["text"], "bbox": [float(v) for v in w["bbox"]], "group": g, "lines": {w.get("line")}})
    return out


def classify_ocr(paragraphs: list[dict]) -> list[str]:
    """Text-only class of each OCR paragraph (rules in the module docstring)."""
    heights = [(p["bbox"][3] - p["bbox"][1]) / max(len(p["lines"]), 1) for p in paragraphs]
    median = statistics.median(heights) if heights else 0.0
    cats = []
    for p, h in zip(paragraphs, heights):
        if CAPTION.match(p["text"]):
            cats.append("Caption")
        elif BULLET.match(p["text"]):
            cats.append("List-item")
        elif len(p["lines"]) <= 2 and median > 0 and h >= 1.3 * median:
            cats.append("Section-header")
        else:
            cats.append("Text")
    return cats


def ocr_page(image: Image.Image, page_id: str, doc_id: str, source: str, ocr_fn: OcrFn) -> dict:
    """One page tuple from an image: OCR spans (paragraphs, reading order of the engine) + boxes."""
    w, h = image.size
    paragraphs = []
    for p in group_words(ocr_fn(image)):
        x0, y0 = max(0.0, p["bbox"][0]), max(0.0, p["bbox"][1])
        x1, y1 = min(float(w), p["bbox"][2]), min(float(h), p["bbox"][3])
        if x1 > x0 and y1 > y0 and p["text"].strip():
            p["bbox"] = [x0, y0, x1, y1]
            paragraphs.append(p)
    cats = classify_ocr(paragraphs)
    spans = [{"text": p["text"], "bbox": p["bbox"], "category": c} for p, c in zip(paragraphs, cats)]
    boxes = [{"category": c, "bbox": p["bbox"]} for p, c in zip(paragraphs, cats)]
    return {"id": page_id, "image": image, "width": w, "height": h, "spans": spans, "boxes": boxes,
            "source": source, "doc_id": doc_id}


def image_pages(path: str | Path, skips: SkipLog | None = None, ocr_fn: OcrFn | None = None,
                doc_id: str | None = None, max_pixels: int = 100_000_000, source: str = "images") -> Iterator[dict]:
    """Page tuples of one image file (one per frame); a page where OCR finds no text is a recorded skip."""
    path, skips = Path(path), ensure_log(skips)
    ocr_fn = ocr_fn or tesseract_ocr
    frames = load_image(path, max_pixels)
    doc_id = doc_id or path.name
    for n, image in enumerate(frames):
        page_id = doc_id if len(frames) == 1 else f"{doc_id}-f{n + 1:03d}"
        page = ocr_page(image, page_id, doc_id, source, ocr_fn)
        if not page["spans"]:
            skips.add(f"{path}" + ("" if len(frames) == 1 else f"#frame={n + 1}"), "no text: OCR found no text")
            continue
        yield page
