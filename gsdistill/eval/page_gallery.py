"""The page gallery of a retrieval evaluation: a seeded, order-free, de-duplicated draw of pages.

One streaming pass over any page iterable (e.g. a ``ShardDataset``) keeps only the chosen pages,
their crop texts and their images resized for ``embed_pages``, so memory is bounded by the
gallery size, not by the number of pages read.
"""
from __future__ import annotations

import hashlib
import heapq
from typing import Iterable

import numpy as np
import torch


def page_crops(page: dict, min_span_chars: int = 1) -> list[str]:
    """The page's span texts (reading order) with at least ``min_span_chars`` non-blank characters."""
    return [s["text"] for s in page.get("spans", [])
            if len("".join(str(s.get("text", "")).split())) >= max(min_span_chars, 1)]


def _image_tensor(image, size: int) -> torch.Tensor:
    """PIL image -> uint8 ``[3, size, size]`` (the whole page squashed, as a scale-1 global view).

    Resized exactly as the training views are (``gsdistill.views.multicrop``: OpenCV area interpolation
    when shrinking, bilinear when enlarging), so a page seen in training is the same image here."""
    import cv2
    arr = np.asarray(image.convert("RGB"), dtype=np.uint8)
    shrink = size < arr.shape[0] or size < arr.shape[1]
    out = cv2.resize(arr, (size, size), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    return torch.from_numpy(np.ascontiguousarray(out)).permute(2, 0, 1)


def select_gallery(pages: Iterable[dict], n_gallery: int, image_size: int, seed: int = 0,
                   min_span_chars: int = 1, dedupe_text: bool = True) -> tuple[list[dict], dict]:
    """One streaming pass: the ``n_gallery`` usable pages with the smallest seeded hash key.

    The key hashes the page's full text (or its id when ``dedupe_text`` is off), so the choice is a
    uniform draw independent of the input order, and pages with identical text collide: only the one
    with the smallest id is kept. Only the chosen pages' images are held (resized to ``image_size``).
    Returns (gallery sorted by id, counts: pages_seen, usable, and skipped reasons).
    """
    heap: list[tuple[str, str]] = []  # max-heap by (key, id) through negated ordering below
    held: dict[str, dict] = {}        # key -> gallery entry currently in the heap
    evicted: set[str] = set()
    counts = {"pages_seen": 0, "usable": 0, "skipped": {"no_usable_span": 0, "duplicate_text": 0,
                                                       "bad_image": 0}}
    seen_ids: set[str] = set()
    for page in pages:
        counts["pages_seen"] += 1
        pid = str(page["id"])
        if pid in seen_ids:
            raise ValueError(f"page id '{pid}' occurs twice in the evaluation pages; ids must be unique")
        seen_ids.add(pid)
        crops = page_crops(page, min_span_chars)
        if not crops:
            counts["skipped"]["no_usable_span"] += 1
            continue
        basis = "\n".join(crops) if dedupe_text else pid
        key = hashlib.sha1(f"{seed}:{basis}".encode()).hexdigest()
        if key in held and dedupe_text:
            counts["skipped"]["duplicate_text"] += 1
            if pid < held[key]["id"]:  # the smallest id of a duplicate group wins, whatever the order
                try:
                    image = _image_tensor(page["image"], image_size)
                except Exception:  # keep the held duplicate; this page counts as the skipped one
                    continue
                held[key] = {"id": pid, "doc_id": str(page.get("doc_id", pid)), "crops": crops,
                             "image": image}
            continue
        if key in evicted:
            counts["skipped"]["duplicate_text"] += 1
            continue
        if len(heap) >= n_gallery and key > _NegKey.key_of(heap[0]):
            evicted.add(key)
            counts["usable"] += 1
            continue
        try:
            image = _image_tensor(page["image"], image_size)
        except Exception as e:  # a broken image is a recorded skip, never a crash mid-gallery
            counts["skipped"]["bad_image"] += 1
            counts.setdefault("bad_image_examples", []).append(f"{pid}: {type(e).__name__}: {e}"[:200])
            continue
        counts["usable"] += 1
        held[key] = {"id": pid, "doc_id": str(page.get("doc_id", pid)), "crops": crops, "image": image}
        heapq.heappush(heap, _NegKey(key))
        if len(heap) > n_gallery:
            out = heapq.heappop(heap).key
            evicted.add(out)
            del held[out]
    gallery = sorted(held.values(), key=lambda e: e["id"])
    return gallery, counts


class _NegKey:
    """Heap item ordered by descending key, so ``heap[0]`` is the largest kept key."""
    __slots__ = ("key",)

    def __init__(self, key: str):
        self.key = key

    def __lt__(self, other: "_NegKey") -> bool:
        return self.key > other.key

    @staticmethod
    def key_of(item: "_NegKey") -> str:
        return item.key
