"""Each view's crop as a row of numbers: what the training step needs to make its pixels.

With ``views.device`` on the GPU the DataLoader workers still draw every random choice of a view with
albumentations' own code (:class:`gsdistill.views.multicrop.MultiCropViews`, same seeds, same order), so
windows, jitter factors, blur kernels and tracked boxes are those of the CPU path by construction: the
transforms are swapped for twins (:data:`TWIN_OPS`) that draw and track as the originals but leave the
pixels alone (a crop's image is an unwritten array of its output size). Without boxes to track,
:func:`drawn_params` calls each twin's own draw methods on generators seeded as ``Compose.set_random_seed``
seeds them, skipping the Compose's bookkeeping (a fifth of the cost). The parameters become one
``float32[CROP_COLUMNS]`` row per view (:func:`crop_row`), which ``gsdistill.views.render`` turns into
pixels for a whole batch at once.

Columns: the window ``x0 y0 x1 y1`` in page pixels; how it is resized (OpenCV's choice for that crop:
:data:`LINEAR`, :data:`BOX` for INTER_AREA shrinking, :data:`BOX_LINEAR` for INTER_AREA enlarging); a
horizontal flip flag; the colour-jitter factors brightness, contrast, saturation, hue (1, 1, 1, 0 when not
jittered) and their order; a greyscale flag; the 5 taps of the Gaussian blur (a 3-tap kernel in the
middle, ``0 0 1 0 0`` when not blurred).
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import albumentations as A
import cv2
import numpy as np
import torch

from gsdistill.views.multicrop import OPS

WINDOW, KIND, FLIP, JITTER, ORDER, GRAY, BLUR = slice(0, 4), 4, 5, slice(6, 10), slice(10, 14), 14, slice(15, 20)
CROP_COLUMNS = 20
LINEAR, BOX, BOX_LINEAR = 0, 1, 2
NO_JITTER = (1.0, 1.0, 1.0, 0.0)
NO_BLUR = (0.0, 0.0, 1.0, 0.0, 0.0)


def _unwritten(size: tuple[int, int], like: np.ndarray) -> np.ndarray:
    """An array of a crop's output shape whose memory is never touched (what the twins pass on)."""
    return np.empty((*size, *like.shape[2:]), dtype=like.dtype)


class _CropTwin(A.RandomResizedCrop):
    """Draws the window and tracks boxes as RandomResizedCrop; cuts nothing."""

    def apply(self, img, crop_coords, **params):
        return _unwritten(self.size, img)


class _ResizeTwin(A.Resize):
    def apply(self, img, **params):
        return _unwritten((self.height, self.width), img)


class _FlipTwin(A.HorizontalFlip):  # boxes are still flipped (apply_to_bboxes): only the pixels wait
    def apply(self, img, **params):
        return img


class _JitterTwin(A.ColorJitter):
    def apply(self, img, **params):
        return img


class _GrayTwin(A.ToGray):
    def apply(self, img, **params):
        return img


class _BlurTwin(A.GaussianBlur):
    def apply(self, img, **params):
        return img


TWIN_OPS = {"crop": _CropTwin, "flip": _FlipTwin, "jitter": _JitterTwin, "gray": _GrayTwin, "blur": _BlurTwin,
            "resize": _ResizeTwin}
assert TWIN_OPS.keys() == OPS.keys() and all(issubclass(TWIN_OPS[k], OPS[k]) for k in OPS)


def resize_kind(crop_hw: tuple[float, float], size: tuple[int, int], area: bool) -> int:
    """OpenCV's resampling of a ``crop_hw`` crop to ``size``: ``area`` (INTER_AREA asked) is a box filter
    when neither side grows, else OpenCV's area-enlarging interpolation; otherwise bilinear."""
    if not area:
        return LINEAR
    return BOX if crop_hw[0] >= size[0] and crop_hw[1] >= size[1] else BOX_LINEAR


class _SeededOnUse:
    """``np.random.default_rng(seed)``, made when first used: of a view's transforms only the jitter's
    order shuffle reads its numpy generator, and making one costs as much as the draws themselves."""

    def __init__(self, seed: int):
        self._seed, self._rng = seed, None

    def __getattr__(self, name):
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return getattr(self._rng, name)


def drawn_params(tf: A.Compose, seed: int, shape: tuple[int, ...]) -> list[dict]:
    """Each transform's parameters (``{}``: not applied) as ``tf.set_random_seed(seed)`` then
    ``tf(image=<shape>)`` would draw them: every transform its own generators seeded with ``seed``, then
    ``BasicTransform.__call__``'s steps (should_apply, get_params, shape, get_params_dependent_on_data).
    Nothing is tracked: for views without boxes (with boxes, call the twin Compose itself)."""
    out, image = [], SimpleNamespace(shape=tuple(shape))
    for t in tf.transforms:
        t.py_random, t.random_generator = random.Random(seed), _SeededOnUse(seed)
        if not t.should_apply():
            out.append({})
            continue
        data = {"image": image}
        params = t.update_transform_params(t.get_params(), data)
        params.update(t.get_params_dependent_on_data(params, data))
        out.append(params)
        if isinstance(t, (_CropTwin, _ResizeTwin)):  # what follows sees the resized crop
            size = t.size if isinstance(t, _CropTwin) else (t.height, t.width)
            image = SimpleNamespace(shape=(*size, *image.shape[2:]))
    return out


def crop_row(transforms, params: list[dict], window=None) -> torch.Tensor:
    """The row of a view from its ``transforms`` (twins) and the ``params`` each drew (``{}``: not applied);
    ``window``: where a span view was cut (resized by the first transform, INTER_AREA)."""
    row = np.zeros(CROP_COLUMNS, dtype=np.float32)
    row[JITTER], row[ORDER], row[BLUR] = NO_JITTER, (0, 1, 2, 3), NO_BLUR
    for t, p in zip(transforms, params):
        if isinstance(t, _CropTwin):
            window = p["crop_coords"]
            crop_hw = (window[3] - window[1], window[2] - window[0])
            shrinks = crop_hw[0] > t.size[0] or crop_hw[1] > t.size[1]
            area = t.area_for_downscale in ("image", "image_mask") and shrinks
            row[KIND] = resize_kind(crop_hw, t.size, area or t.interpolation == cv2.INTER_AREA)
        elif isinstance(t, _ResizeTwin):
            row[KIND] = resize_kind((window[3] - window[1], window[2] - window[0]), (t.height, t.width),
                                    t.interpolation == cv2.INTER_AREA)
        elif isinstance(t, _FlipTwin):
            row[FLIP] = bool(p)
        elif isinstance(t, _JitterTwin) and p:
            row[JITTER] = (p["brightness"], p["contrast"], p["saturation"], p["hue"])
            row[ORDER] = p["order"]
        elif isinstance(t, _GrayTwin):
            row[GRAY] = bool(p)
        elif isinstance(t, _BlurTwin) and p:
            kernel = np.asarray(p["kernel"], dtype=np.float32)
            if kernel.size > 5:
                raise ValueError(f"blur kernels of {kernel.size} taps: the batched views take at most 5")
            row[BLUR] = 0.0
            row[BLUR.start + (5 - kernel.size) // 2: BLUR.start + (5 + kernel.size) // 2] = kernel
        elif not isinstance(t, (_JitterTwin, _BlurTwin)):
            raise TypeError(f"{type(t).__name__}: no twin draws its parameters (gsdistill.views.crop_params)")
    row[WINDOW] = window
    return torch.from_numpy(row)
