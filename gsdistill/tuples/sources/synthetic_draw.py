"""Tables and pictures for synthetic pages (drawn with PIL; the caller records their boxes)."""
from __future__ import annotations

import random

from PIL import ImageDraw


def draw_table(draw: ImageDraw.ImageDraw, rng: random.Random, text, x: float, y: float, width: float,
               max_h: float, font, ink) -> tuple[float, float, str]:
    """A table in ``[x, x+width] x [y, ...]``: booktabs rules or a full grid. Returns (x1, y1, text)
    where text is the rows joined by ' ; ' and cells by ' | ' (the span the encoder sees)."""
    n_cols = rng.randint(2, 5)
    asc, desc = font.getmetrics()
    row_h = asc + desc + 6
    n_rows = max(2, min(rng.randint(3, 9), int(max_h // row_h)))
    col_w = width / n_cols
    grid = rng.random() < 0.4
    rows = [[text.cell(header=r == 0) for _ in range(n_cols)] for r in range(n_rows)]
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            cell_fit = cell
            while cell_fit and font.getlength(cell_fit) > col_w - 6:
                cell_fit = cell_fit[:-1]
            row[c] = cell_fit
            draw.text((x + c * col_w + 3, y + r * row_h + 3), cell_fit, font=font, fill=ink)
    y1 = y + n_rows * row_h
    rule_ys = [y, y + row_h, y1] if not grid else [y + r * row_h for r in range(n_rows + 1)]
    for ry in rule_ys:
        draw.line([(x, ry), (x + width, ry)], fill=ink, width=1)
    if grid:
        for c in range(n_cols + 1):
            cx = min(x + c * col_w, x + width - 1)
            draw.line([(cx, y), (cx, y1)], fill=ink, width=1)
    return x + width, y1, " ; ".join(" | ".join(row) for row in rows)


def _colour(rng: random.Random) -> tuple[int, int, int]:
    return rng.randint(0, 220), rng.randint(0, 220), rng.randint(0, 220)


def draw_picture(draw: ImageDraw.ImageDraw, rng: random.Random, x0: float, y0: float, x1: float, y1: float) -> None:
    """A bar chart, line plot, photo-like patch or block diagram filling the box exactly
    (a frame is drawn on the box edges so the ground-truth box is the drawn extent)."""
    kind = rng.choice(["bars", "lines", "photo", "diagram"])
    w, h = x1 - x0, y1 - y0
    if kind == "photo":
        top, bot = _colour(rng), _colour(rng)
        steps = 16
        for i in range(steps):
            f = i / (steps - 1)
            c = tuple(int(a + (b - a) * f) for a, b in zip(top, bot))
            draw.rectangle([x0, y0 + h * i / steps, x1, y0 + h * (i + 1) / steps], fill=c)
        for _ in range(rng.randint(2, 6)):
            cx, cy, r = rng.uniform(x0, x1), rng.uniform(y0, y1), rng.uniform(0.05, 0.25) * min(w, h)
            draw.ellipse([max(x0, cx - r), max(y0, cy - r), min(x1, cx + r), min(y1, cy + r)], fill=_colour(rng))
    elif kind == "bars":
        n = rng.randint(3, 10)
        bw = w * 0.8 / n
        for i in range(n):
            bh = rng.uniform(0.1, 0.85) * h
            bx = x0 + w * 0.1 + i * bw
            draw.rectangle([bx + bw * 0.1, y1 - h * 0.05 - bh, bx + bw * 0.9, y1 - h * 0.05], fill=_colour(rng))
    elif kind == "lines":
        for _ in range(rng.randint(1, 3)):
            pts, val = [], rng.uniform(0.2, 0.8)
            for i in range(20):
                val = min(0.95, max(0.05, val + rng.uniform(-0.1, 0.1)))
                pts.append((x0 + w * (0.08 + 0.88 * i / 19), y0 + h * (1 - val)))
            draw.line(pts, fill=_colour(rng), width=2)
        draw.line([(x0 + w * 0.06, y0 + h * 0.05), (x0 + w * 0.06, y1 - h * 0.05), (x1 - w * 0.03, y1 - h * 0.05)],
                  fill=(0, 0, 0), width=1)
    else:
        n = rng.randint(2, 5)
        bw = w / (2 * n)
        cy = (y0 + y1) / 2
        for i in range(n):
            bx = x0 + bw * (0.5 + 2 * i)
            draw.rectangle([bx, cy - h * 0.15, bx + bw, cy + h * 0.15], outline=_colour(rng), width=2)
            if i < n - 1:
                draw.line([(bx + bw, cy), (bx + 2 * bw, cy)], fill=(0, 0, 0), width=2)
    draw.rectangle([x0, y0, x1 - 1, y1 - 1], outline=(90, 90, 90), width=1)
