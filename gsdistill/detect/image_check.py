"""Does each image of a detection data set decode? The whole image is decoded, since a truncated file
opens (and passes PIL's ``verify``, which Ultralytics uses) until its missing bytes are needed.

Decoding every page of a large set takes minutes, and ``compare`` / ``ablate`` train several heads on
one set, so the images that decoded are remembered by size and modification time in
``.gsdistill_decoded.json`` beside the data YAML (where it can be written; else nothing is kept).
An image that failed is checked again each time: its reason is reported each time.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image

MIN_SIDE = 10  # Ultralytics drops images with a side under 10 pixels
MEMO = ".gsdistill_decoded.json"


def image_problem(path: Path) -> str | None:
    """Why ``path`` cannot be trained on, or None."""
    try:
        with Image.open(path) as im:
            size = im.size
            im.draft(im.mode, (max(1, size[0] // 8), max(1, size[1] // 8)))  # JPEG: every byte read, 1/8 scale
            im.load()
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError, ...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        reason = reason.replace(f"'{path}'", "").replace(str(path), "").strip()  # the caller names the file
        return f"unreadable image ({type(e).__name__}{': ' + reason if reason else ''})"
    if min(size) < MIN_SIDE:
        return f"image of {size[0]}x{size[1]} pixels (Ultralytics needs at least {MIN_SIDE} a side)"
    return None


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


class DecodedImages:
    """The images of one data YAML known to decode; :meth:`problems` checks the others."""

    def __init__(self, data_yaml: str | Path) -> None:
        self.path = Path(data_yaml).parent / MEMO
        try:
            known = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or damaged: everything is decoded again
            known = {}
        self.known: dict[str, list[int]] = known if isinstance(known, dict) else {}

    def problems(self, images: list[Path]) -> list[str | None]:
        """Per image, why it cannot be trained on, or None."""
        todo = [p for p in images if self.known.get(os.path.abspath(p)) != _stamp(p)]
        # PIL decodes outside the GIL: a few threads check a large set several times faster
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            found = dict(zip(todo, pool.map(image_problem, todo)))
        for p in todo:
            if found[p] is None:
                self.known[os.path.abspath(p)] = _stamp(p)
        return [found.get(p) for p in images]

    def save(self) -> None:
        try:
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")  # two runs may check one set at once
            tmp.write_text(json.dumps(self.known))
            tmp.replace(self.path)
        except OSError:  # a read-only data set: checked in full next time
            pass
