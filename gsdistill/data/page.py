"""Checks and conversions shared by every builder: page-tuple validation, image modes, box clipping."""
from __future__ import annotations

import numpy as np
from PIL import Image

from gsdistill.data.errors import DataError
from gsdistill.data.labels import CLASS_TO_ID

PAGE_KEYS = ("id", "image", "width", "height", "spans", "boxes")


def to_rgb(img: Image.Image, source: str = "image") -> Image.Image:
    """Any PIL mode -> 8-bit RGB. 16-bit and float greyscale are rescaled by their own range (a plain
    ``convert`` would clip them to white); CMYK/palette/alpha go through PIL's converters (alpha is
    composed on white, as a page would be printed)."""
    try:
        img.load()
    except Exception as e:  # PIL raises many types for truncated/corrupt data
        raise DataError(f"{source}: cannot decode image ({type(e).__name__}: {e})") from None
    if img.mode == "RGB":
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        lo, hi = float(arr.min()), float(arr.max())
        scaled = np.zeros_like(arr) if hi <= lo else (arr - lo) / (hi - lo) * 255.0
        return Image.fromarray(scaled.round().astype(np.uint8), "L").convert("RGB")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def clip_bbox(bbox, width: int, height: int) -> list[float] | None:
    """Box clipped to the page; None when nothing of it is left (zero area after clipping)."""
    x0, y0, x1, y1 = (float(v) for v in bbox)
    x0, x1 = sorted((x0, x1))
    y0, y1 = sorted((y0, y1))
    x0, y0 = max(0.0, x0), max(0.0, y0)
    x1, y1 = min(float(width), x1), min(float(height), y1)
    if x1 - x0 <= 0 or y1 - y0 <= 0:
        return None
    return [round(x0, 2), round(y0, 2), round(x1, 2), round(y1, 2)]


def union_bbox(bboxes) -> list[float]:
    arr = np.asarray(list(bboxes), dtype=np.float64)
    return [float(arr[:, 0].min()), float(arr[:, 1].min()), float(arr[:, 2].max()), float(arr[:, 3].max())]


def validate_page(page: dict) -> None:
    """DataError naming the page when a tuple breaks the contract (keys, classes, image size)."""
    missing = [k for k in PAGE_KEYS if k not in page]
    pid = page.get("id", "<no id>")
    if missing:
        raise DataError(f"page {pid}: missing keys {missing}")
    img = page["image"]
    if img is not None and tuple(img.size) != (page["width"], page["height"]):
        raise DataError(f"page {pid}: image is {img.size[0]}x{img.size[1]} but width/height say "
                        f"{page['width']}x{page['height']}")
    for b in page["boxes"]:
        if b["category"] not in CLASS_TO_ID:
            raise DataError(f"page {pid}: box class '{b['category']}' is not a DocLayNet class")
        if len(b["bbox"]) != 4:
            raise DataError(f"page {pid}: bbox {b['bbox']} does not have 4 numbers")
    for s in page["spans"]:
        if not isinstance(s.get("text"), str) or len(s.get("bbox", ())) != 4:
            raise DataError(f"page {pid}: span {s!r:.80} needs a text and a 4-number bbox")
