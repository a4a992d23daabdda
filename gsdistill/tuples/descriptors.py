"""Box-text descriptors and the texts of a page that the frozen text encoder embeds.

A layout box becomes a short string, the geometric positive ``b_i`` of paper 003 §5.4. The string
format is versioned and chosen by ``data.descriptor_format``; the name goes into the text-embedding
cache key (``gsdistill.tuples.store.text_cache``), so switching formats rebuilds the cache.

Formats (``FORMATS``; measured by ``tools/bench/bench_descriptors.py``, see docs/learning.md):

* ``cls-xyxy1000-v1`` - the paper's form: class, then x0 y0 x1 y1 in 0..1000 of the page,
  ``"Table 112 430 884 702"``. A frozen sentence encoder embeds the class word and barely the
  numbers (Spearman of embedding cosine vs geometric closeness of Table boxes: 0.34 synthetic, 0.18 real).
* ``cls-words3-v1`` - the crude word form of issue 11: ``"Table, middle right, wide, short"``
  (thirds of the page / of its size). Coarse: many boxes share one string.
* ``cls-poles8-v1`` - each of centre x, centre y, width, height is written as 8 words split between
  its two pole words in proportion to the value: centre x 0.25 -> ``left`` x6 + ``right`` x2.
  Mean pooling turns the word counts into a linear blend of the two poles' directions, so the
  embedding cosine falls smoothly with the distance of the boxes (why repetition, not one word).
* ``cls-compass8-v1`` - the same with rarer pole words (west/east, north/south, thin/broad,
  flat/high), which keep more of the geometry when page context is appended.
* page context, appended after ``"; "`` so that a page's descriptors differ from other pages':
  ``-nb`` the classes of the boxes before and after it in reading order (``"after Caption, before
  Text"``), ``-n`` the page's box count (``"one of 19 boxes"``), ``-nc`` that and the count of the
  box's class, ``-nr`` its reading-order rank (``"box 4 of 19"``), ``-sig`` the counts of the page's
  rarer classes (``"page with 2 Table, 1 Title"``), ``-xy`` the legacy corner numbers (boxes of one
  page share its column edges). Context costs geometry: the default ``cls-compass8-n-v1`` is the
  format measured to keep Spearman >= 0.5 on synthetic and real pages (0.69 / 0.58) with the most
  page identity (a descriptor finds its own page among 32 for 18 % / 37 %, vs 6 % / 14 % without).
"""
from __future__ import annotations

from typing import Callable, Sequence

SCALE = 1000
LEGACY_FORMAT = "cls-xyxy1000-v1"
POLES = (("left", "right"), ("top", "bottom"), ("narrow", "wide"), ("short", "tall"))
# Rarer words for the same poles: measured to keep more of the geometry when page context is appended.
COMPASS = (("west", "east"), ("north", "south"), ("thin", "broad"), ("flat", "high"))


def normalise_bbox(bbox: Sequence[float], width: int, height: int) -> list[int]:
    """Pixels -> integers in 0..1000 of the page, clamped, rounded half to even (Python round)."""
    if width <= 0 or height <= 0:
        raise ValueError(f"page size must be positive, got {width}x{height}")
    x0, y0, x1, y1 = (float(v) for v in bbox)
    out = [x0 / width, y0 / height, x1 / width, y1 / height]
    return [int(round(min(max(v, 0.0), 1.0) * SCALE)) for v in out]


def box_geometry(bbox: Sequence[float], width: int, height: int) -> tuple[float, float, float, float]:
    """(centre x, centre y, width, height) in 0..1000 of the page: the geometry the bench compares."""
    x0, y0, x1, y1 = normalise_bbox(bbox, width, height)
    return (x0 + x1) / 2, (y0 + y1) / 2, float(x1 - x0), float(y1 - y0)


def box_descriptor(category: str, bbox: Sequence[float], width: int, height: int) -> str:
    """``"<Class> x0 y0 x1 y1"`` with coordinates in 0..1000 of the page (format ``cls-xyxy1000-v1``)."""
    return " ".join([category, *map(str, normalise_bbox(bbox, width, height))])


def _third(value: float, words: Sequence[str]) -> str:
    """The word of the third of 0..1000 that ``value`` falls in (the upper edge goes to the last)."""
    return words[min(int(value * 3 // SCALE), 2)]


def words3_descriptor(category: str, bbox: Sequence[float], width: int, height: int) -> str:
    """``"Table, middle right, wide, short"``: position and size in thirds (format ``cls-words3-v1``)."""
    cx, cy, w, h = box_geometry(bbox, width, height)
    return (f"{category}, {_third(cy, ('top', 'middle', 'bottom'))} {_third(cx, ('left', 'center', 'right'))}, "
            f"{_third(w, ('narrow', 'medium width', 'wide'))}, {_third(h, ('short', 'medium height', 'tall'))}")


def pole_words(value: float, low: str, high: str, repeats: int = 8) -> str:
    """``value`` in 0..1000 as ``repeats`` words: ``round(value / 1000 * repeats)`` of them ``high``."""
    k = int(round(min(max(value, 0.0), SCALE) / SCALE * repeats))
    return " ".join([low] * (repeats - k) + [high] * k)


def poles_descriptor(category: str, bbox: Sequence[float], width: int, height: int, repeats: int = 8,
                     poles: Sequence[tuple[str, str]] = POLES) -> str:
    """``"Table, left x6 right x2, top ..., narrow ..., short ..."`` (format ``cls-poles8-v1``)."""
    geometry = box_geometry(bbox, width, height)
    return ", ".join([category, *(pole_words(v, lo, hi, repeats) for v, (lo, hi) in zip(geometry, poles))])


def compass_descriptor(category: str, bbox: Sequence[float], width: int, height: int) -> str:
    """``poles_descriptor`` with the ``COMPASS`` words (format ``cls-compass8-v1``)."""
    return poles_descriptor(category, bbox, width, height, poles=COMPASS)


def _per_box(describe: Callable[[str, Sequence[float], int, int], str]) -> Callable[[dict], list[str]]:
    """A page-level format from a per-box one (no page context)."""
    return lambda page: [describe(b["category"], b["bbox"], page["width"], page["height"]) for b in page["boxes"]]


def _neighbours(page: dict) -> list[str]:
    """``"after <class of the previous box>, before <class of the next>"`` in the page's box order
    (reading order for every builder); ``start`` / ``end`` at the ends."""
    cats = ["start", *(b["category"] for b in page["boxes"]), "end"]
    return [f"after {cats[i]}, before {cats[i + 2]}" for i in range(len(page["boxes"]))]


def _box_count(page: dict) -> list[str]:
    """``"one of <N> boxes"``: the same page-level words on every descriptor of the page."""
    return [f"one of {len(page['boxes'])} boxes"] * len(page["boxes"])


def _class_count(page: dict) -> list[str]:
    """``"one of <N> boxes, <M> <class>"``: the page's box count and that of the box's class."""
    n = len(page["boxes"])
    return [f"one of {n} boxes, {sum(o['category'] == b['category'] for o in page['boxes'])} {b['category']}"
            for b in page["boxes"]]


def _rank(page: dict) -> list[str]:
    """``"box <i> of <N>"``: the box's place in reading order and the page's box count."""
    n = len(page["boxes"])
    return [f"box {i + 1} of {n}" for i in range(n)]


_SIGNATURE_CLASSES = ("Formula", "Picture", "Section-header", "Table", "Title")


def _signature(page: dict) -> list[str]:
    """``"page with 2 Table, 1 Title"``: counts of the page's rarer classes, on every descriptor."""
    counts = [(c, sum(b["category"] == c for b in page["boxes"])) for c in _SIGNATURE_CLASSES]
    words = ", ".join(f"{n} {c}" for c, n in counts if n) or "no figures"
    return [f"page with {words}"] * len(page["boxes"])


def _corners(page: dict) -> list[str]:
    """``"x0 y0 x1 y1"`` in 0..1000 (the legacy numbers): boxes of one page share column edges."""
    return [" ".join(map(str, normalise_bbox(b["bbox"], page["width"], page["height"]))) for b in page["boxes"]]


def _with_context(describe, *contexts: Callable[[dict], list[str]]) -> Callable[[dict], list[str]]:
    """A page-level format: each box's descriptor, then ``"; "`` and its page-context phrases."""
    def texts(page: dict) -> list[str]:
        parts = [_per_box(describe)(page), *(context(page) for context in contexts)]
        return ["; ".join(p) for p in zip(*parts)]
    return texts


# name -> page -> one descriptor per box, in the page's box order. Never change a registered
# format's output: add a new name (the version suffix) instead, so cached embeddings stay valid.
FORMATS: dict[str, Callable[[dict], list[str]]] = {
    LEGACY_FORMAT: _per_box(box_descriptor),
    "cls-words3-v1": _per_box(words3_descriptor),
    "cls-poles8-v1": _per_box(poles_descriptor),
    "cls-poles8-nb-v1": _with_context(poles_descriptor, _neighbours),
    "cls-compass8-v1": _per_box(compass_descriptor),
    "cls-compass8-nb-v1": _with_context(compass_descriptor, _neighbours),
    "cls-compass8-n-v1": _with_context(compass_descriptor, _box_count),
    "cls-compass8-n-nb-v1": _with_context(compass_descriptor, _box_count, _neighbours),
    "cls-compass8-sig-v1": _with_context(compass_descriptor, _signature),
    "cls-compass8-nc-v1": _with_context(compass_descriptor, _class_count),
    "cls-compass8-nr-v1": _with_context(compass_descriptor, _rank),
    "cls-compass8-xy-v1": _with_context(compass_descriptor, _corners),
    "cls-compass8-n-xy-v1": _with_context(compass_descriptor, _box_count, _corners),
}
DEFAULT_FORMAT = "cls-compass8-n-v1"
DESCRIPTOR_VERSION = DEFAULT_FORMAT  # the format used when none is named


def check_format(name: str | None) -> str:
    """``name`` if registered (``None`` -> ``DEFAULT_FORMAT``); else ValueError listing the formats."""
    if name is None:
        return DEFAULT_FORMAT
    if name not in FORMATS:
        raise ValueError(f"unknown descriptor format {name!r}; choose one of {', '.join(FORMATS)}")
    return name


def span_texts(page: dict, max_spans: int | None = None) -> list[str]:
    """The semantic positives: span texts in reading order (the first ``max_spans``)."""
    spans = page["spans"] if max_spans is None else page["spans"][:max_spans]
    return [s["text"] for s in spans]


def box_texts(page: dict, max_boxes: int | None = None, fmt: str | None = None) -> list[str]:
    """The geometric positives: one descriptor per layout box (the first ``max_boxes``) in format
    ``fmt`` (default ``DEFAULT_FORMAT``). Page context, where a format has it, sees every box."""
    texts = FORMATS[check_format(fmt)](page)
    return texts if max_boxes is None else texts[:max_boxes]


def single_positive_texts(page: dict, fmt: str | None = None) -> tuple[str, str]:
    """(all spans joined in reading order, that text followed by every box descriptor).

    These are the single-positive baselines of paper 003 Table 2/3: one semantic text per page and
    one joint semantic + geometric text.
    """
    sem = " ".join(span_texts(page))
    joint = " ".join([sem, *box_texts(page, fmt=fmt)]).strip()
    return sem, joint
