"""The common label set (DocLayNet's 11 classes) and the mappings onto it from other sources.

Every box in a page tuple carries one of ``DOCLAYNET_CLASSES``. PubLayNet (5 classes) and DocBank
(13 token labels) are mapped by the tables below; why each mapping is what it is sits beside it.
"""
from __future__ import annotations

import difflib

# Official DocLayNet order (category ids 1..11 in its COCO json follow this order).
DOCLAYNET_CLASSES: list[str] = [
    "Caption", "Footnote", "Formula", "List-item", "Page-footer", "Page-header",
    "Picture", "Section-header", "Table", "Text", "Title",
]
CLASS_TO_ID: dict[str, int] = {name: i for i, name in enumerate(DOCLAYNET_CLASSES)}

PUBLAYNET_CLASSES: list[str] = ["text", "title", "list", "table", "figure"]
PUBLAYNET_TO_DOCLAYNET: dict[str, str] = {
    "text": "Text",
    # PubLayNet's "title" covers section headings far more often than the article title
    # (one title per paper vs. many headings), so the heading class is the closer match.
    "title": "Section-header",
    # PubLayNet boxes a whole list; DocLayNet boxes each item. The class is still a list item.
    "list": "List-item",
    "table": "Table",
    "figure": "Picture",
}

# DocLayNet's 11 classes folded onto PubLayNet's 5, the class set real PDFs label consistently
# (issue 21: a detector trained on a few hundred pages cannot learn 11 classes of which 6 occur on
# under 5 % of pages). PubLayNet boxes captions, footnotes and formulas inside its "text" class,
# titles and section headings as "title", and leaves running heads and page numbers unlabelled:
# they are dropped here (None), counted in the converter's manifest, as PubLayNet's annotators did.
DOCLAYNET_TO_PUBLAYNET: dict[str, str | None] = {
    "Caption": "text", "Footnote": "text", "Formula": "text", "Text": "text",
    "Title": "title", "Section-header": "title",
    "List-item": "list", "Table": "table", "Picture": "figure",
    "Page-header": None, "Page-footer": None,
}
LABEL_SETS: dict[str, tuple[list[str], dict | None]] = {
    "doclaynet": (DOCLAYNET_CLASSES, None),
    "publaynet": (PUBLAYNET_CLASSES, DOCLAYNET_TO_PUBLAYNET),
}

DOCBANK_CLASSES: list[str] = [
    "abstract", "author", "caption", "date", "equation", "figure", "footer", "list",
    "paragraph", "reference", "section", "table", "title",
]
DOCBANK_TO_DOCLAYNET: dict[str, str] = {
    "abstract": "Text",
    "author": "Text",        # DocLayNet labels author blocks as Text
    "caption": "Caption",
    "date": "Text",
    "equation": "Formula",
    "figure": "Picture",
    "footer": "Footnote",    # DocBank's "footer" marks footnotes (all 10 sample pages that use it)
    "list": "List-item",
    "paragraph": "Text",
    "reference": "List-item",  # DocLayNet's guideline boxes each bibliography entry as a List-item
    "section": "Section-header",
    "table": "Table",
    "title": "Title",
}

# Spellings met in the wild for the same DocLayNet class (lower-cased, without separators).
_DOCLAYNET_ALIASES: dict[str, str] = {c.lower().replace("-", "").replace("_", ""): c for c in DOCLAYNET_CLASSES}

SOURCE_MAPS: dict[str, dict[str, str]] = {
    "publaynet": PUBLAYNET_TO_DOCLAYNET,
    "docbank": DOCBANK_TO_DOCLAYNET,
}


def to_doclaynet(name: str, source: str = "doclaynet") -> str | None:
    """Map a class name of ``source`` ("doclaynet", "publaynet", "docbank") onto DocLayNet's classes.

    Returns None for a name the source does not define (the caller records the skip).
    """
    source = source.lower()
    key = name.strip()
    if source == "doclaynet":
        return _DOCLAYNET_ALIASES.get(key.lower().replace("-", "").replace("_", "").replace(" ", ""))
    if source not in SOURCE_MAPS:
        hint = difflib.get_close_matches(source, ["doclaynet", *SOURCE_MAPS], n=1)
        raise ValueError(f"unknown label source '{source}'" + (f"; did you mean '{hint[0]}'?" if hint else ""))
    return SOURCE_MAPS[source].get(key.lower())


def check_class(name: str) -> str:
    """``name`` if it is one of DocLayNet's classes, else ValueError with a did-you-mean hint."""
    if name in CLASS_TO_ID:
        return name
    hint = difflib.get_close_matches(name, DOCLAYNET_CLASSES, n=1)
    raise ValueError(f"'{name}' is not a DocLayNet class" + (f"; did you mean '{hint[0]}'?" if hint else ""))
