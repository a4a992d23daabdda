"""Multi-crop views of a page tuple for self-distillation (paper 003 §5.1; DINOv2 defaults).

``MultiCropViews(page)`` draws ``n_global`` global crops (``global_size`` px, area share
``global_scale``) and ``n_local`` local crops (``local_size`` px, ``local_scale``) with
document-appropriate photometric augmentation (colour jitter of strength ``color_jitter``, blur
with probability ``blur_prob``, occasional greyscale; no horizontal flip unless ``hflip``:
mirrored text is not text). The views of a page are a pure function of ``(seed, page id)``, so a
resumed stream need not replay the augmentations of the pages it skips. With ``track_boxes`` the
page's span and layout boxes go through the same albumentations transforms and
``views[i]["boxes"]`` are the boxes in that crop's pixels (clipped; boxes that fall outside are
dropped with their labels); pretraining does not use them, so it is off by default. With
``region_boxes`` (``objective.region_geom``) the layout boxes alone are tracked through the global
crops and each sample carries ``region_pool``: per global view, which patch cells each box covers
(``gsdistill.views.region_pool``); the pixels are the same as without it.
Each student global view also gets an iBOT block mask over its patch grid (with ``page_masks=False``
none: the training stream draws a whole batch's masks at once, ``gsdistill.views.masking.batch_masks``).

Local crops come in two kinds (``local_mode``). ``random``: DINO's, a random region of
``local_scale`` of the page area, resized to ``local_size``; on a real page shrunk that way a text
line is 2-3 px high. ``spans``: a square of about ``local_span_px`` page pixels (x0.8-1.25) around
a random point of a random text span, resized to ``local_size``, so the text of real documents is
seen near its native size (with ``local_span_px`` = 96 and ``local_size`` = 64, a 10 px line of a
72 dpi page is about 7 px high): the paper's local views are crops of the page at its own
resolution, the only views in which a CPU-sized model can see real text. In that mode each sample
also carries ``local_span_mask``: per local view, which of the page's first ``max_spans`` spans (the
rows of its ``sem_emb``) it shows, for the local text term (``objective.local_sem``).

Crops are ``uint8`` pixels (``gsdistill.views.pixels``): the model normalises them on its device.
With ``views.device`` on a GPU (``gsdistill.views.batched_views``) the same class draws every choice and
tracks every box, and the pixels are cut, resized and jittered for the whole batch in the training step.

``collate_pretrain`` stacks samples into the view-major batch the model consumes
(:meth:`gsdistill.models.gsdistill_model.GSDistill.forward`): every page's view 0, then every
page's view 1, ...; ``local_span_mask`` alone is page-major, ``bool[B, n_local, S]``; ``region_pool``
is view-major like the crops, ``float[n_global * B, S, P]`` over ``geom_emb``'s padded rows.
"""
from __future__ import annotations

import zlib

import albumentations as A
import cv2
import numpy as np
import torch

from gsdistill.views.collate import collate_pretrain  # noqa: F401  (where callers have always imported it)
from gsdistill.views.masking import view_mask
from gsdistill.views.region_pool import layout_only, region_pool_weights

LOCAL_MODES = ("random", "spans")
# the transforms a view goes through; gsdistill.views.batched_views swaps in twins that draw the same
# parameters and track the same boxes but leave the pixels to the training step
OPS = {"crop": A.RandomResizedCrop, "flip": A.HorizontalFlip, "jitter": A.ColorJitter, "gray": A.ToGray,
       "blur": A.GaussianBlur, "resize": A.Resize}


def _pipeline(size: int, scale: tuple[float, float], hflip: bool, color_jitter: float, blur_prob: float,
              track_boxes: bool, ops_of: dict = OPS) -> A.Compose:
    # area interpolation when shrinking: a page shrunk 5x with plain bilinear sampling aliases away
    # thin rules and text lines, and the model would learn views unlike any evaluation page image
    ops = [ops_of["crop"](size=(size, size), scale=tuple(scale), ratio=(3 / 4, 4 / 3), area_for_downscale="image")]
    if hflip:
        ops.append(ops_of["flip"](p=0.5))
    if color_jitter > 0:
        cj = color_jitter
        ops.append(ops_of["jitter"](brightness=cj, contrast=cj, saturation=cj / 2, hue=0.05, p=0.8))
        ops.append(ops_of["gray"](p=0.2))
    if blur_prob > 0:
        ops.append(ops_of["blur"](blur_limit=(3, 5), p=blur_prob))
    if not track_boxes:
        return A.Compose(ops)
    return A.Compose(ops, bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"],
                                                   clip=True, min_visibility=0.0, filter_invalid_bboxes=True))


def _photometric(size: int, color_jitter: float, blur_prob: float, ops_of: dict = OPS) -> A.Compose:
    """Resize an already cut region to ``size`` (area interpolation when shrinking), jitter."""
    ops = [ops_of["resize"](size, size, interpolation=cv2.INTER_AREA)]
    if color_jitter > 0:
        cj = color_jitter
        ops += [ops_of["jitter"](brightness=cj, contrast=cj, saturation=cj / 2, hue=0.05, p=0.8), ops_of["gray"](p=0.2)]
    if blur_prob > 0:
        ops.append(ops_of["blur"](blur_limit=(3, 5), p=blur_prob))
    return A.Compose(ops)


def has_area(bbox) -> bool:
    """A box ``[x0, y0, x1, y1]`` that covers some area (spans of zero width or height exist in PDFs)."""
    return bbox[2] > bbox[0] and bbox[3] > bbox[1]


def square_window(page: dict, cx: float, cy: float, side: float) -> tuple[int, int, int, int]:
    """The square ``[x0, y0, x1, y1)`` of ``side`` page pixels (at most the page's shorter side) centred
    on ``(cx, cy)``, moved (not cut) to lie inside the page."""
    w, h = int(page["width"]), int(page["height"])
    side = int(round(min(side, w, h)))
    left = int(np.clip(round(cx - side / 2), 0, w - side))
    top = int(np.clip(round(cy - side / 2), 0, h - side))
    return left, top, left + side, top + side


def chosen_span_window(page: dict, side_px: float, rng: np.random.Generator) -> tuple[tuple[int, int, int, int], int | None]:
    """:func:`span_window` and the index in ``page["spans"]`` of the span it was drawn around (None without spans)."""
    side = side_px * float(np.exp(rng.uniform(np.log(0.8), np.log(1.25))))
    spans = [i for i, s in enumerate(page.get("spans", [])) if has_area(s["bbox"])]
    if not spans:
        return square_window(page, int(page["width"]) / 2, int(page["height"]) / 2, side), None
    chosen = spans[int(rng.integers(len(spans)))]
    x0, y0, x1, y1 = (float(v) for v in page["spans"][chosen]["bbox"])
    return square_window(page, rng.uniform(x0, x1), rng.uniform(y0, y1), side), chosen


def span_window(page: dict, side_px: float, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """A square window ``[x0, y0, x1, y1)`` of about ``side_px`` (x0.8-1.25) page pixels around a random
    point of a random text span, moved (not cut) to lie inside the page; the page centre without spans."""
    return chosen_span_window(page, side_px, rng)[0]


def spans_in_window(page: dict, window, n: int, chosen: int | None = None) -> np.ndarray:
    """``bool[n]`` over ``page["spans"][:n]`` (the rows of the page's cached ``sem_emb``, same order):
    True for a span whose box centre lies in ``window`` ``[x0, y0, x1, y1)`` and for ``chosen``, the span
    the window was drawn around (its centre may lie outside when the window was moved onto the page)."""
    x0, y0, x1, y1 = window
    out = np.zeros(n, dtype=bool)
    for i, s in enumerate(page.get("spans", [])[:n]):
        b = s["bbox"]
        cx, cy = (b[0] + b[2]) / 2, (b[1] + b[3]) / 2
        out[i] = has_area(b) and x0 <= cx < x1 and y0 <= cy < y1
    if chosen is not None and chosen < n:
        out[chosen] = True
    return out


def _shift_boxes(boxes: tuple[np.ndarray, list[str]], window, size: int) -> dict:
    """Page-pixel boxes -> pixels of the ``size`` view of ``window`` (clipped; outside ones dropped)."""
    x0, y0, x1, y1 = window
    k = size / (x1 - x0)
    b = (np.clip(boxes[0], [x0, y0, x0, y0], [x1, y1, x1, y1]) - [x0, y0, x0, y0]) * k
    keep = ((b[:, 2] - b[:, 0]) >= 1) & ((b[:, 3] - b[:, 1]) >= 1)
    return {"bboxes": b[keep].astype(np.float32).reshape(-1, 4), "labels": [lab for lab, m in zip(boxes[1], keep) if m]}


def page_boxes(page: dict) -> tuple[np.ndarray, list[str]]:
    """All span and layout boxes of a page (pixels, clipped to it) with labels ``span:<i>`` / ``box:<i>``."""
    w, h = page["width"], page["height"]
    rows, labels = [], []
    for kind, items in (("span", page.get("spans", [])), ("box", page.get("boxes", []))):
        for i, item in enumerate(items):
            x0, y0, x1, y1 = (float(v) for v in item["bbox"])
            x0, x1 = sorted((min(max(x0, 0), w), min(max(x1, 0), w)))
            y0, y1 = sorted((min(max(y0, 0), h), min(max(y1, 0), h)))
            if x1 - x0 >= 1 and y1 - y0 >= 1:
                rows.append([x0, y0, x1, y1])
                labels.append(f"{kind}:{i}")
    return np.asarray(rows, dtype=np.float32).reshape(-1, 4), labels


class MultiCropViews:
    """Callable: page tuple -> ``{"global_crops", "local_crops", "masks", embeddings..., "id"}`` (plus
    ``"global_boxes"``, ``"local_boxes"`` with ``track_boxes``); deterministic for (seed, page id)."""

    OPS = OPS  # the transforms' classes (a subclass may swap them)

    def __init__(self, global_size: int = 224, local_size: int = 96, n_global: int = 2, n_local: int = 8,
                 global_scale=(0.32, 1.0), local_scale=(0.05, 0.32), patch_size: int = 16,
                 mask_prob: float = 0.5, mask_ratio=(0.1, 0.5), hflip: bool = False, color_jitter: float = 0.4,
                 blur_prob: float = 0.1, max_spans: int = 32, seed: int = 0, track_boxes: bool = False,
                 local_mode: str = "random", local_span_px: int = 96, region_boxes: bool = False, page_masks: bool = True):
        if global_size % patch_size:
            raise ValueError(f"global_size={global_size} is not a multiple of patch_size={patch_size}")
        if n_global < 1:
            raise ValueError("n_global must be >= 1")
        self.n_global, self.n_local, self.max_spans = n_global, n_local, max_spans
        self.grid = (global_size // patch_size, global_size // patch_size)
        self.mask_prob, self.mask_ratio = float(mask_prob), tuple(mask_ratio)
        self.track_boxes, self.region_boxes, self.patch_size = bool(track_boxes), bool(region_boxes), int(patch_size)
        self.global_tf = _pipeline(global_size, global_scale, hflip, color_jitter, blur_prob,
                                   self.track_boxes or self.region_boxes, self.OPS)
        if local_mode not in LOCAL_MODES:
            raise ValueError(f"local_mode must be one of {LOCAL_MODES}, got {local_mode!r}")
        self.local_mode, self.local_size, self.local_span_px = local_mode, int(local_size), float(local_span_px)
        self.local_tf = _pipeline(local_size, local_scale, hflip, color_jitter, blur_prob, self.track_boxes, self.OPS)
        self.span_tf = _photometric(local_size, color_jitter, blur_prob, self.OPS)
        self.seed = int(seed)
        self.page_masks = bool(page_masks)  # False: the batch draws them (views.masking.batch_masks)

    @classmethod
    def from_config(cls, v, patch_size: int, seed: int, region_boxes: bool = False,
                    page_masks: bool = True) -> "MultiCropViews":
        """The views of a pretraining config's ``views`` section (``configs/pretrain/default.yaml``);
        ``region_boxes``: what ``objective.region_geom`` reads; ``page_masks=False``: no iBOT masks per
        page (the training stream draws them per batch)."""
        return cls(global_size=int(v["global_size"]), local_size=int(v["local_size"]), n_global=int(v["n_global"]),
                   n_local=int(v["n_local"]), global_scale=tuple(v["global_scale"]),
                   local_scale=tuple(v["local_scale"]), patch_size=patch_size, mask_prob=float(v["mask_prob"]),
                   mask_ratio=tuple(v["mask_ratio"]), max_spans=int(v["max_spans"]), hflip=bool(v["hflip"]),
                   color_jitter=float(v["color_jitter"]), blur_prob=float(v["blur_prob"]), seed=seed,
                   local_mode=str(v["local_mode"]), local_span_px=int(v["local_span_px"]), region_boxes=region_boxes,
                   page_masks=page_masks)

    def _span_view(self, rng: np.random.Generator, page: dict, image: np.ndarray, boxes) -> tuple:
        """(crop, its boxes or None, (window, index of the span it was drawn around))."""
        window, chosen = chosen_span_window(page, self.local_span_px, rng)
        crop = self._span_crop(image, window, int(rng.integers(2**31)))
        return crop, (None if boxes is None else _shift_boxes(boxes, window, self.local_size)), (window, chosen)

    def _span_crop(self, image: np.ndarray, window, seed: int) -> torch.Tensor:
        """The ``uint8 [3, size, size]`` pixels of ``image[window]`` through ``span_tf`` seeded with ``seed``."""
        x0, y0, x1, y1 = window
        self.span_tf.set_random_seed(seed)
        out = self.span_tf(image=np.ascontiguousarray(image[y0:y1, x0:x1]))
        return torch.from_numpy(np.ascontiguousarray(out["image"].transpose(2, 0, 1)))

    def _view(self, tf: A.Compose, rng: np.random.Generator, image: np.ndarray, boxes) -> tuple:
        return self._crop(tf, int(rng.integers(2**31)), image, boxes)

    def _crop(self, tf: A.Compose, seed: int, image: np.ndarray, boxes) -> tuple:
        """(``uint8 [3, size, size]`` pixels of the view ``tf`` seeded with ``seed`` makes of ``image``, its boxes
        or None)."""
        tf.set_random_seed(seed)
        if boxes is None:
            out = tf(image=image)
        else:
            out = tf(image=image, bboxes=boxes[0], labels=boxes[1])
        tensor = torch.from_numpy(np.ascontiguousarray(out["image"].transpose(2, 0, 1)))
        if boxes is None:
            return tensor, None
        return tensor, {"bboxes": np.asarray(out["bboxes"], dtype=np.float32).reshape(-1, 4),
                        "labels": list(out["labels"])}

    def __call__(self, page: dict) -> dict:
        return self._views_of(page, np.asarray(page["image"].convert("RGB")))

    def _views_of(self, page: dict, image: np.ndarray) -> dict:
        boxes = page_boxes(page) if self.track_boxes else None
        global_boxes = page_boxes(layout_only(page)) if self.region_boxes and boxes is None else boxes
        rng = np.random.default_rng([self.seed, zlib.crc32(str(page["id"]).encode("utf-8"))])
        g = [self._view(self.global_tf, rng, image, global_boxes) for _ in range(self.n_global)]
        windows = None
        if self.local_mode == "spans":
            loc = [self._span_view(rng, page, image, boxes) for _ in range(self.n_local)]
            windows = [w for _, _, w in loc]
        else:
            loc = [self._view(self.local_tf, rng, image, boxes) for _ in range(self.n_local)]
        sample = {"id": page["id"], "global_crops": [t for t, *_ in g], "local_crops": [t for t, *_ in loc]}
        if self.page_masks:  # drawn last: the crops are the same without them
            sample["masks"] = [torch.from_numpy(view_mask(self.grid, self.mask_prob, self.mask_ratio, rng)) for _ in g]
        if self.track_boxes:
            sample["global_boxes"], sample["local_boxes"] = [b for _, b, *_ in g], [b for _, b, *_ in loc]
        for key in ("sem_emb", "geom_emb"):
            if key in page:
                sample[key] = np.asarray(page[key], dtype=np.float32)[: self.max_spans]
        if self.region_boxes:  # over geom_emb's rows: one descriptor per box, in the page's box order
            n = len(sample["geom_emb"]) if "geom_emb" in sample else min(len(page.get("boxes", [])), self.max_spans)
            sample["region_pool"] = [region_pool_weights(b["bboxes"], b["labels"], self.grid, self.patch_size, n)
                                     for _, b in g]
        if windows is not None:  # the spans each local view shows (objective.local_sem), over sem_emb's rows
            n = len(sample["sem_emb"]) if "sem_emb" in sample else min(len(page.get("spans", [])), self.max_spans)
            sample["local_span_mask"] = [spans_in_window(page, w, n, chosen) for w, chosen in windows]
        for key in ("sp_sem_emb", "sp_geom_emb", "sp_joint_emb"):
            if key in page:
                sample[key] = np.asarray(page[key], dtype=np.float32)
        return sample
