"""The DataLoader side of views made in the training step (``views.device``): the page once, plus crop rows.

``views.device`` chooses where a batch's crops get their pixels (:func:`views_in_step`):

- ``cpu``: in the DataLoader workers, by albumentations/OpenCV (:class:`MultiCropViews`, today's path, byte
  for byte);
- ``cuda``: in the training step on the GPU (``gsdistill.views.render``: a few batched tensor ops, compiled
  with the step); the workers decode the page, draw every choice of every view and track its boxes, and
  send the page as ``uint8`` once with one row of crop parameters per view (``gsdistill.views.crop_params``);
- ``auto``: ``cuda`` when the run trains on a GPU, else ``cpu``;
- ``batched``: the ``cuda`` path on whatever device trains, the CPU included (tests, comparisons).

:class:`BatchedViews` is that worker side: ``MultiCropViews`` with twin transforms, so windows, factors,
masks, span picks, tracked boxes and region pools are the CPU path's for the same ``(seed, page id)``. The
page is decoded from the shard's bytes (``zst``, the default storage: 0.3 ms a 512x640 page on one core;
a PNG by OpenCV: 1.3 ms, PIL's decode and RGB copy 1.6-3.0) as RGB. Every page is padded to the run's
canvas (:func:`page_canvas`: the batch shape never changes, so a compiled step compiles once); a larger
page is shrunk to fit (INTER_AREA) with its windows, counted (``pages_shrunk``), never an error.
"""
from __future__ import annotations

import io
from pathlib import Path

import cv2
import numpy as np
import torch

from gsdistill.device import resolve_device
from gsdistill.errors import InputError
from gsdistill.tuples.errors import DataError
from gsdistill.tuples.store.image_codec import DamagedImage, ZstdUnavailable, decode_zst, image_kind
from gsdistill.views.crop_params import TWIN_OPS, WINDOW, crop_row, drawn_params
from gsdistill.views.multicrop import MultiCropViews

VIEWS_DEVICES = ("auto", "cpu", "cuda", "batched")
CANVAS_STEP = 16  # canvas sides rounded up to it: matrix sides the GPU's tensor cores tile well


def views_in_step(cfg) -> bool:
    """Whether the run's views get their pixels in the training step (``views.device``, module doc)."""
    name = str(cfg["views"].get("device", "cpu"))  # configs saved before the key: today's path
    if name not in VIEWS_DEVICES:
        raise InputError(f"views.device must be one of {', '.join(VIEWS_DEVICES)}, got {name!r}")
    if name in ("cpu", "batched"):
        return name == "batched"
    trains_on = resolve_device(cfg["train"]["device"], key="train.device").type
    if name == "cuda" and trains_on != "cuda":
        raise InputError(f"views.device=cuda needs a run on a GPU (train.device resolves to {trains_on}); "
                         "use views.device=auto, cpu, or batched (the same ops on the training device)")
    return trains_on == "cuda"


def _round_up(n: int) -> int:
    return -(-int(n) // CANVAS_STEP) * CANVAS_STEP


def page_canvas(shard_dir: str | Path, manifest: dict | None) -> tuple[int, int]:
    """``(height, width)`` every page of a run is padded to: the manifest's largest page where it records
    one, else the largest page of the first shard (each rank reads the same; a later, larger page is
    shrunk to fit), rounded up to a multiple of :data:`CANVAS_STEP`."""
    import json

    from gsdistill.tuples.store.reader import iter_tar, list_shards

    manifest = manifest or {}
    if "max_page_height" in manifest and "max_page_width" in manifest:
        return _round_up(manifest["max_page_height"]), _round_up(manifest["max_page_width"])
    sizes = [(int(p["height"]), int(p["width"])) for p in
             (json.loads(members["json"]) for _, members in iter_tar(list_shards(shard_dir)[0]))]
    if not sizes:
        raise DataError(f"{shard_dir}: the first shard holds no pages to size the views' canvas by")
    return _round_up(max(h for h, _ in sizes)), _round_up(max(w for _, w in sizes))


def page_rgb(page: dict) -> np.ndarray:
    """``uint8 [H, W, 3]`` RGB pixels of a page whose image is the shard's bytes (or a PIL image); may be
    read-only (the ``zst`` frame's own buffer: no copy)."""
    image = page["image"]
    if not isinstance(image, (bytes, bytearray, memoryview)):  # a PIL image: pages made in memory
        return np.asarray(image.convert("RGB"))
    if image_kind(image) == "zst":  # raw RGB in a Zstandard frame (the default): 0.3 ms a page, PNG 1.3
        try:
            return decode_zst(image)
        except DamagedImage as e:
            raise DataError(f"page {page.get('id')!r}: damaged page image ({e}); rebuild its shard") from None
        except ZstdUnavailable as e:
            raise DataError(f"page {page.get('id')!r}: {e}") from None
    rgb_flag = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10 decodes to RGB itself
    pixels = cv2.imdecode(np.frombuffer(image, dtype=np.uint8), cv2.IMREAD_COLOR if rgb_flag is None else rgb_flag)
    if pixels is None:
        raise DataError(f"page {page.get('id')!r}: damaged page image (OpenCV cannot decode it); rebuild its shard")
    return pixels if rgb_flag is not None else cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)


class BatchedViews(MultiCropViews):
    """Page tuple -> ``{"page", "page_hw", "canvas", "global_params", "local_params", ...}``: the sample of
    ``MultiCropViews`` with crop rows in place of crop pixels, and the RGB page (shrunk to fit ``canvas`` when
    larger; ``collate_pretrain`` pads the batch's pages to it)."""

    OPS = TWIN_OPS

    def __init__(self, *args, canvas: tuple[int, int] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.canvas = canvas  # None: each page as it is (a batch then needs pages of one size)

    @classmethod
    def from_config(cls, v, patch_size: int, seed: int, region_boxes: bool = False, page_masks: bool = True,
                    canvas: tuple[int, int] | None = None) -> "BatchedViews":
        views = super().from_config(v, patch_size, seed, region_boxes=region_boxes, page_masks=page_masks)
        views.canvas = canvas
        return views

    def _crop(self, tf, seed: int, image: np.ndarray, boxes) -> tuple:
        """(the view's crop row, its boxes or None): the twin Compose itself where boxes are tracked."""
        if boxes is None:
            return crop_row(tf.transforms, drawn_params(tf, seed, image.shape)), None
        tf.set_random_seed(seed)
        out = tf(image=image, bboxes=boxes[0], labels=boxes[1])
        return crop_row(tf.transforms, [t.params for t in tf.transforms]), \
            {"bboxes": np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4), "labels": list(out["labels"])}

    def _span_crop(self, image: np.ndarray, window, seed: int) -> torch.Tensor:
        x0, y0, x1, y1 = window
        return crop_row(self.span_tf.transforms, drawn_params(self.span_tf, seed, (y1 - y0, x1 - x0, image.shape[2])),
                        window)

    def __call__(self, page: dict) -> dict:
        image = page_rgb(page)
        sample = self._views_of(page, image)
        sample["global_params"], sample["local_params"] = sample.pop("global_crops"), sample.pop("local_crops")
        sample["page"], sample["pages_shrunk"] = self._fitted(image, sample)
        sample["page_hw"] = sample["page"].shape[:2]
        sample["canvas"] = tuple(self.canvas or sample["page_hw"])
        return sample

    def _fitted(self, image: np.ndarray, sample: dict) -> tuple[np.ndarray, int]:
        """The page as decoded (no copy: ``collate.page_batch`` writes it once onto the batch's canvas), or
        shrunk to fit the canvas when larger, its windows with it; and 1 when it was shrunk."""
        if self.canvas is None:
            return image, 0
        (h, w), (ch, cw) = image.shape[:2], self.canvas
        shrunk = h > ch or w > cw
        if shrunk:
            f = min(ch / h, cw / w)
            size = (min(cw, max(1, round(w * f))), min(ch, max(1, round(h * f))))
            image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
            scale = torch.tensor([size[0] / w, size[1] / h] * 2)
            for row in sample["global_params"] + sample["local_params"]:
                row[WINDOW] = row[WINDOW] * scale
        return image, int(shrunk)


def encoded_png(image) -> bytes:
    """A PIL image's PNG bytes as the shard writer stores them (tests and tools: pages made in memory)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()
