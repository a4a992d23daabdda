"""The pixels of a batch's views, made in the training step from its pages and crop rows (``views.device``).

What albumentations/OpenCV do to one crop at a time in the DataLoader workers (``MultiCropViews``), done
here to every crop of a batch at once by a few tensor ops on the training device, inside the (compiled)
step; the crop rows (``gsdistill.views.crop_params``) carry every choice, drawn in the workers:

- cut and resize (:func:`cut_and_resize`): each crop is ``Wy @ page @ Wx.T``, with per-crop resampling
  matrices built on the device from its window: OpenCV's INTER_AREA box filter when shrinking (every page
  pixel weighted by its overlap with the output pixel: no aliasing of thin rules and text lines), its
  bilinear / area-enlarging taps otherwise, a horizontal flip as reversed columns. Two batched matmuls
  per crop size (tensor cores in float16 on a GPU: pages are integers <= 255, exact in float16);
- colour jitter in each crop's own order, greyscale, Gaussian blur (per-crop 5-tap separable kernels, one
  grouped convolution), each rounded or truncated to integers where OpenCV's ``uint8`` ops are, so the
  statistics of the views match the CPU path's (``tests/test_views_device.py``).

Shapes depend only on the batch and the config, so a compiled step compiles once. Autocast is off here: a
bfloat16 page would round the pixels of the intermediate rows to whole grey levels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from gsdistill.views.crop_params import BLUR, BOX, FLIP, GRAY, JITTER, KIND, LINEAR, ORDER, WINDOW

GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # OpenCV's RGB2GRAY


def page_rows(pages: torch.Tensor) -> torch.Tensor:
    """``uint8 [B, H, W, 3]`` RGB pages -> ``[B, H, 3 * W]`` rows of R, G and B (float16 on a GPU, else float32)."""
    dtype = torch.float16 if pages.is_cuda else torch.float32
    b, h, w, _ = pages.shape
    return pages.permute(0, 1, 3, 2).to(dtype).reshape(b, h, 3 * w)


def axis_weights(origin: torch.Tensor, length: torch.Tensor, kind: torch.Tensor, size: int,
                 extent: int) -> torch.Tensor:
    """``float32 [N, size, extent]``: how each of ``size`` output pixels samples the ``extent`` page pixels
    along one axis, for windows ``[origin, origin + length)`` resampled as ``kind`` says (OpenCV's maths)."""
    i = torch.arange(size, device=origin.device, dtype=torch.float32).view(1, size, 1)
    j = torch.arange(extent, device=origin.device, dtype=torch.float32).view(1, 1, extent)
    origin, length, kind = (t.float().view(-1, 1, 1) for t in (origin, length, kind))
    step = length / size
    low = origin + i * step
    box = (torch.minimum(low + step, j + 1) - torch.maximum(low, j)).clamp_min(0) / step
    linear = (i + 0.5) * step - 0.5
    left = torch.floor(i * step)  # INTER_AREA enlarging: OpenCV's area-mode taps
    frac = (i + 1) - (left + 1) / step
    frac = torch.where(frac <= 0, torch.zeros_like(frac), frac - torch.floor(frac))
    at = torch.where(kind == LINEAR, linear, left + frac)
    at = origin + torch.minimum(at.clamp_min(0), length - 1)  # the crop's edge pixels repeat
    tent = (1 - (j - at).abs()).clamp_min(0)
    return torch.where(kind == BOX, box, tent)


def cut_and_resize(rows: torch.Tensor, params: torch.Tensor, size: int) -> torch.Tensor:
    """``float32 [V * B, 3, size, size]`` crops (view-major, as ``params``) of the pages' ``rows``."""
    b, h, w3 = rows.shape
    w, views = w3 // 3, params.shape[0] // b
    p = params.view(views, b, -1).transpose(0, 1).reshape(b * views, -1)  # page-major: one matmul per page
    x0, y0, x1, y1 = p[:, WINDOW].unbind(1)
    wy = axis_weights(y0, y1 - y0, p[:, KIND], size, h).to(rows.dtype).view(b, views * size, h)
    wx = axis_weights(x0, x1 - x0, p[:, KIND], size, w)
    wx = torch.where(p[:, FLIP].view(-1, 1, 1) > 0, wx.flip(1), wx).to(rows.dtype)
    cut = torch.bmm(wy, rows).view(b * views, size * 3, w)  # rows (output row, channel)
    out = torch.bmm(cut, wx.transpose(1, 2))
    return out.view(b, views, size, 3, size).permute(1, 0, 3, 2, 4).reshape(views * b, 3, size, size).float()


def _each(values: torch.Tensor) -> torch.Tensor:
    return values.view(-1, 1, 1, 1)


def gray(x: torch.Tensor) -> torch.Tensor:
    """``[N, 1, S, S]`` grey levels (rounded, as OpenCV's ``uint8`` RGB2GRAY)."""
    weights = torch.tensor(GRAY_WEIGHTS, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    return (x * weights).sum(1, keepdim=True).round()


def shift_hue(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """``x`` with its HSV hue turned by ``turns`` (per crop; 1 = the whole circle), value and saturation kept."""
    high, low = x.amax(1, keepdim=True), x.amin(1, keepdim=True)
    chroma = high - low
    r, g, b = x.unbind(1)
    r, g, b = r[:, None], g[:, None], b[:, None]
    safe = torch.where(chroma > 0, chroma, torch.ones_like(chroma))
    sector = torch.where(high == r, (g - b) / safe, torch.where(high == g, 2 + (b - r) / safe, 4 + (r - g) / safe))
    hue = torch.remainder(sector / 6 + _each(turns), 1.0)
    k = torch.remainder(torch.tensor([5.0, 3.0, 1.0], device=x.device).view(1, 3, 1, 1) + hue * 6, 6)
    return (high - chroma * torch.minimum(k, 4 - k).clamp(0, 1)).round()


def color_jitter(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Brightness, contrast, saturation and hue in each crop's drawn order (albumentations' ColorJitter on
    ``uint8``: truncating lookup tables, contrast about the mean grey level, saturation against grey)."""
    factors, order = params[:, JITTER], params[:, ORDER]
    for k in range(4):  # at step k each crop applies one op; the other three are identities for it
        op = order[:, k]
        brightness, contrast, saturation = (_each(torch.where(op == i, factors[:, i], torch.ones_like(op)))
                                            for i in range(3))
        x = (x * brightness).clamp(0, 255).floor()
        mean = gray(x).mean((1, 2, 3), keepdim=True)
        x = (x * contrast + mean * (1 - contrast)).clamp(0, 255).floor()
        x = (x * saturation + gray(x) * (1 - saturation)).clamp(0, 255).round()
        turns = torch.where(op == 3, factors[:, 3], torch.zeros_like(op))
        x = torch.where(_each(turns) != 0, shift_hue(x, turns), x)
    return x


def blur(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Per-crop separable 5-tap kernels (identity ``0 0 1 0 0`` for crops not blurred), reflected edges
    (OpenCV's BORDER_REFLECT_101), one grouped convolution per direction."""
    n, c, s, _ = x.shape
    taps = params[:, BLUR].repeat_interleave(c, 0)
    y = F.pad(x.reshape(1, n * c, s, s), (2, 2, 2, 2), mode="reflect")
    y = F.conv2d(y, taps.view(n * c, 1, 5, 1), groups=n * c)
    y = F.conv2d(y, taps.view(n * c, 1, 1, 5), groups=n * c)
    return y.view(n, c, s, s).round().clamp(0, 255)


def render_views(rows: torch.Tensor, params: torch.Tensor, size: int) -> torch.Tensor:
    """``float32 [V * B, 3, size, size]`` pixels in ``[0, 255]`` of the views ``params`` describes, from the
    batch's :func:`page_rows`: cut, resized, jittered, greyed and blurred as the CPU path does."""
    with torch.autocast(rows.device.type, enabled=False):
        x = cut_and_resize(rows, params, size).round().clamp(0, 255)
        x = color_jitter(x, params)
        x = torch.where(_each(params[:, GRAY]) > 0, gray(x).expand_as(x), x)
        return blur(x, params)
