"""Layout heuristics for born-digital PDF pages: text blocks, rules and images -> DocLayNet regions.

Input is what pymupdf reports for one page (``get_text("dict")`` blocks, ``get_drawings()``), in
PDF points. Every rule below is relative to the page so it works at any page size:

* **body size** = the character-weighted most common font size of the page (rounded to 0.5 pt),
  monospaced and math fonts left out (code or subscripts must not become the body size).
* **Page-header / Page-footer**: a short block (<= 2 lines, <= 80 chars, not larger than body)
  wholly inside the top / bottom ``MARGIN_BAND`` of the page height; or the page's topmost /
  bottommost short block inside the top / bottom 16% when a gap of >= 1.5 x body separates it
  from every other block (LaTeX's running heads and page numbers sit in wide margins); a bare
  page number as the lowest / highest block (``pdf_layout_blocks.mark_margins``).
* **Caption** (checked first: IEEE sets "TABLE V" at the very top): block text begins with
  "Figure/Fig./Table/Tab./Listing/Algorithm/Scheme N" (N: 3, 2.1, IV, B1) followed by ":", "." or
  a dash; or its first line is only that label ("TABLE V" over the title); or the label is followed
  by a capitalised word and the block is smaller than body or starts bold ("Fig. 1 Sketch of ...",
  ASME). "Figure 3 shows ..." in running text stays Text.
* **Formula**: >= ``MATH_SHARE`` of the block's characters are set in math fonts (CMMI, CMSY, CMEX,
  MSAM/MSBM, *Math*, Symbol, ...), or >= 15% with an equation number "(3.12)" ending a line,
  unless it reads as a sentence (>= 4 words in text fonts, or one line opening with a capitalised
  word: "Let X be ..."); or the block is only an equation number ("(4)", "(4) 2"). pymupdf cuts
  display math into many small blocks: formula blocks closer than 0.8 x body vertically and
  3 x body horizontally are merged (``merge_formulas``), taking along short (<= 40 chars) one-line
  text blocks between them (operators and numbers set in text fonts); an equation number joins
  the Formula on its row however far (DocLayNet's box includes it) and a Formula inside another
  joins it.
* **Title**: on a document's first page, the largest block of size >= 1.25 x body in the top 45%,
  or >= 1.1 x body and bold when it is the topmost block (REVTeX: a 12 pt bold title over 10 pt).
* **Section-header**: <= 3 lines, <= 160 chars, and size >= 1.12 x body (unless that size holds
  >= 20 % of the page's text: a second body size) or >= 80% bold with at most 2 lines; or short
  (<= 2 lines, <= 12 words, no closing punctuation) and all capitals (small caps, IEEE); or one
  numbered line "6. Review" / "IV. Results" / "B. Model" (a capital after the number, at most two
  dots) at body size or italic, not part of a run of numbered blocks (a list). On the first page a
  header candidate in the top 40 % with commas, "and", digits, "@" or affiliations is an author
  line: Text.
* **Footnote**: size <= 0.92 x body, in the bottom 35% of the page, starting with a superscript
  span or a footnote mark (digit, *, dagger, double dagger, section sign), under half of its
  characters in a monospaced font (numbered code lines in small type are not footnotes; a note
  holding a URL is); stacked notes, body text below: ``pdf_layout_blocks.fix_footnotes``.
* **List-item**: a line starting with a bullet glyph or an enumeration ("1.", "(a)", "iv)");
  a block holding several items is split into one region per item.
* **Table**, **Picture**: ``pdf_layout_graphics``; text inside them is absorbed (spans keep the
  class). Splitting blocks, line numbers, margins, footnotes, double spacing and sub-figure
  captions: ``pdf_layout_blocks``.
* **Text**: every other text block.

Reading order (``pdf_layout_blocks.reading_order``): page headers, then the body split into bands
at full-width blocks; inside a band, blocks of the left column before the right one, each top to
bottom; then footnotes, then page footers.
"""
from __future__ import annotations

import re
from collections import Counter

MARGIN_BAND = 0.09
MATH_SHARE = 0.4
_MATH_FONT = re.compile(r"cmmi|cmsy|cmex|cmbsy|msam|msbm|math|symbol|eufm|rsfs|esint|stmary|wasy|mnsymbol|"
                        r"lmmono.*math|cambria math|mt ?extra|euler", re.I)
_CAPTION_LABEL = r"^\s*(?i:figure|fig\.?|table|tab\.|listing|algorithm|scheme|chart)\s*(\d+|[IVXL]+|[A-Z]\d*)(\.\d+)*[a-z]?"
CAPTION = re.compile(_CAPTION_LABEL + r"\s*[:.|\u2013\u2014]")
_CAPTION_ALONE = re.compile(_CAPTION_LABEL + r"\s*$")  # "TABLE V" on its own line (IEEE)
_CAPTION_BARE = re.compile(_CAPTION_LABEL + r"\s+[A-Z]")  # "Fig. 1 Sketch of ..." (ASME), no punctuation
BULLET = re.compile(r"^\s*([\u2022\u25e6\u25aa\u25cf\u25cb\u2023\u2043\u2219\u00b7\u2013\u2014\u25a0\u25a1\u27a2\u2192\u22c4*\-]"
                     r"|\(?\d{1,2}[.)]\s|\(?[a-h][.)]\s|\(?(i|ii|iii|iv|v|vi|vii|viii|ix|x)[.)]\s)")
# "6. Review", "2.1 Data sets", "IV. SYSTEM MODEL", "B. Discrete-time model": a number, then a capital
HEADING_NUMBER = re.compile(r"^\s*(\d{1,2}(\.\d{1,2})*\.?|[IVX]{1,5}\.|[A-H]\.)\s+[A-Z]")
SUBFIGURE = re.compile(r"^\s*\(([a-h]|[ivx]{1,4})\)\s")
_EQ_NUMBER = re.compile(r"^\(\s*\d+(\.\d+)*[a-z]?\s*\)$")
_EQ_NUMBER_START = re.compile(r"^\(\s*\d+(\.\d+)*[a-z]?\s*\)(\s+\S{1,4})?$")  # "(4)", "(4) 2" (an exponent beside it)
_EQ_NUMBER_END = re.compile(r"\(\s*\d+(\.\d+)*[a-z]?\s*\)$")
_MONO_FONT = re.compile(r"cmtt|sfmono|mono|courier|typewriter|lmtt|inconsolata|\btt", re.I)
# "3 The", "3The" (mark glued on), "* Equal"; not "2016.", "3.5" or "30th"
_FOOT_MARK = re.compile(r"^\s*(\d{1,2}(?=\s|[A-Z])|[*\u2020\u2021\u00a7\u00b6\u2217])")
_AUTHORS = re.compile(r",|\band\b|@|\d|\u2217|\u2020|\u2021|university|institute|department", re.I)


def union_box(rects) -> list[float]:
    rects = list(rects)
    return [min(r[0] for r in rects), min(r[1] for r in rects), max(r[2] for r in rects), max(r[3] for r in rects)]


def centre_inside(inner, outer, tol: float = 2.0) -> bool:
    cx, cy = (inner[0] + inner[2]) / 2, (inner[1] + inner[3]) / 2
    return outer[0] - tol <= cx <= outer[2] + tol and outer[1] - tol <= cy <= outer[3] + tol


def _area(r) -> float:
    return max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])


def text_lines(block: dict) -> list[dict]:
    """The non-empty lines of a pymupdf text block: text, bbox, chars per font size / math / bold."""
    out = []
    for line in block.get("lines", []):
        spans = [s for s in line.get("spans", []) if s.get("text", "").strip()]
        if not spans:
            continue
        text = " ".join(" ".join(s["text"].split()) for s in spans)
        out.append({"text": text, "bbox": list(line["bbox"]), "spans": spans})
    return out


def _is_mono(span: dict) -> bool:
    return _kind(span)["mono"]


_WORD = re.compile(r"[A-Za-z]{3,}")


def _kind(span: dict) -> dict:
    """Per-span facts, computed once and kept in the span (blocks are re-measured after splits)."""
    kind = span.get("_kind")
    if kind is None:
        font, flags, text = span.get("font", "").lower(), span.get("flags", 0), span["text"]
        math = bool(_MATH_FONT.search(font))
        kind = span["_kind"] = {
            "chars": len(text.strip()), "size": round(span["size"] * 2) / 2, "math": math,
            "bold": bool(flags & 16 or "bold" in font or font.endswith("-medi")),
            "italic": bool(flags & 2 or "ital" in font or "oblique" in font),
            "mono": bool(flags & 8 or _MONO_FONT.search(font)),
            "words": 0 if math else len(_WORD.findall(text)),
            "letters": sum(c.isalpha() for c in text), "upper": sum(c.isupper() for c in text)}
    return kind


def block_stats(lines: list[dict]) -> dict:
    sizes, totals = Counter(), Counter()
    for line in lines:
        for s in line["spans"]:
            k = _kind(s)
            sizes[k["size"]] += k["chars"]
            totals["n"] += k["chars"]
            for key in ("math", "bold", "italic", "mono"):
                totals[key] += k["chars"] if k[key] else 0
            for key in ("words", "letters", "upper"):
                totals[key] += k[key]
    n = max(totals["n"], 1)
    first = lines[0]["spans"][0] if lines else {}
    first_kind = _kind(first) if first else {"math": False, "bold": False}
    return {"chars": n, "size": sizes.most_common(1)[0][0] if sizes else 0.0, "math": totals["math"] / n,
            "bold": totals["bold"] / n, "mono": totals["mono"] / n, "italic": totals["italic"] / n,
            "caps": totals["upper"] / max(totals["letters"], 1), "letters": totals["letters"], "words": totals["words"],
            "sentence_start": bool(re.match(r"[A-Z][a-z]{2,}\b", first.get("text", "").strip())) and not first_kind["math"],
            "superscript_start": bool(first.get("flags", 0) & 1), "first_bold": first_kind["bold"]}


def st_rows(lines: list[dict]) -> int:
    """Visual lines of a block: pymupdf makes a separate 'line' of each piece on one baseline."""
    centres = sorted((ln["bbox"][1] + ln["bbox"][3]) / 2 for ln in lines)
    return sum(1 for i, c in enumerate(centres) if i == 0 or c - centres[i - 1] > 2.0)


def body_size(blocks: list[dict]) -> float:
    """Most common font size by characters, monospaced and math fonts left out (on a code-heavy
    page the code font, on a math-heavy one the subscript size would otherwise become the body
    size and every paragraph a Section-header)."""
    counts, other = Counter(), Counter()
    for b in blocks:
        for line in b["lines"]:
            for s in line["spans"]:
                aside = _is_mono(s) or _MATH_FONT.search(s.get("font", ""))
                (other if aside else counts)[round(s["size"] * 2) / 2] += len(s["text"].strip())
    counts = counts or other
    return counts.most_common(1)[0][0] if counts else 10.0


def mark_common_sizes(blocks: list[dict]) -> None:
    """``block["common_size"]``: its size holds >= 20 % of the page's text characters, so it is a
    second body size (appendix text above a page of small references), not a heading size."""
    chars: Counter = Counter()
    for b in blocks:
        chars[b["stats"]["size"]] += b["stats"]["chars"]
    total = sum(chars.values()) or 1
    for b in blocks:
        b["common_size"] = chars[b["stats"]["size"]] >= 0.2 * total


def _is_caption(block: dict, body: float) -> bool:
    first = block["lines"][0]["text"] if block["lines"] else block["text"]
    st = block["stats"]
    return bool(CAPTION.match(block["text"]) or _CAPTION_ALONE.match(first)
                or (_CAPTION_BARE.match(first) and (st["size"] < body * 0.97 or st["first_bold"])))


def _is_heading(block: dict, body: float, n_lines: int) -> bool:
    """Section-header: short, and set apart by size, weight, slant or capitals, or numbered "6. Review"."""
    st, text = block["stats"], block["text"].strip()
    if n_lines > 3 or len(text) > 160 or st["letters"] < 2:
        return False
    if (st["size"] >= body * 1.12 and not block.get("common_size")) or (st["bold"] >= 0.8 and n_lines <= 2):
        return True
    short = n_lines <= 2 and len(text.split()) <= 12 and not text.endswith((".", ",", ";", ":"))
    if short and st["caps"] >= 0.9 and st["letters"] >= 4:  # small caps (IEEE) read as capitals
        return True
    # "V. Lebedev and V. Lempitsky. 2016." is a reference, not heading "V. Results"
    numbered = n_lines == 1 and bool(HEADING_NUMBER.match(text)) and not block.get("in_list") and text.count(".") <= 2
    return short and numbered and (st["italic"] >= 0.8 or st["size"] >= body * 0.97)


def classify_text(block: dict, body: float, page_w: float, page_h: float, first_page: bool) -> str:
    """DocLayNet class of one text block (see the module docstring for the rules)."""
    st, text, n_lines = block["stats"], block["text"], st_rows(block["lines"])
    x0, y0, x1, y1 = block["bbox"]
    short = n_lines <= 2 and len(text) <= 80 and st["size"] <= body * 1.1
    if _is_caption(block, body):  # before the margins: IEEE puts "TABLE V" at the very top
        return "Caption"
    if short and (y1 <= page_h * MARGIN_BAND or block.get("margin") == "top"):
        return "Page-header"
    if short and (y0 >= page_h * (1 - MARGIN_BAND) or block.get("margin") == "bottom"):
        return "Page-footer"
    eq_line = any(_EQ_NUMBER_END.search(ln["text"]) for ln in block["lines"])
    # "Let X ∈ C be ...": inline math inside a sentence is Text, not display math
    prose = st["words"] >= 4 or (st["sentence_start"] and n_lines == 1)
    if (st["math"] >= MATH_SHARE or (st["math"] >= 0.15 and eq_line)) and not prose or _EQ_NUMBER_START.match(text):
        return "Formula"
    if first_page and y1 <= page_h * 0.45 and block.get("largest") and (
            st["size"] >= body * 1.25 or (st["size"] >= body * 1.1 and st["bold"] >= 0.8 and block.get("topmost"))):
        return "Title"
    if st["size"] <= body * 0.92 and y0 >= page_h * 0.65 and st["mono"] < 0.5 and \
            (st["superscript_start"] or _FOOT_MARK.match(text)):
        return "Footnote"
    if _is_heading(block, body, n_lines):
        if first_page and y1 <= page_h * 0.4 and _AUTHORS.search(text) and not HEADING_NUMBER.match(text):
            return "Text"  # author and affiliation lines under the title: DocLayNet Text
        return "Section-header"
    if BULLET.match(text):
        return "List-item"
    return "Text"


def split_list_items(lines: list[dict]) -> list[list[dict]]:
    """Lines of one block -> one group per list item (a new item starts at a bullet/number line)."""
    groups: list[list[dict]] = []
    for line in lines:
        if not groups or BULLET.match(line["text"]):
            groups.append([line])
        else:
            groups[-1].append(line)
    return groups


def _near(a, b, dy: float, dx: float) -> bool:
    return a[1] - dy <= b[3] and b[1] - dy <= a[3] and a[0] - dx <= b[2] and b[0] - dx <= a[2]


def merge_formulas(regions: list[dict], body: float) -> list[dict]:
    """Merge the pieces of display math (see the module docstring) into one Formula region each."""
    def piece(r):
        short = len(r["text"]) <= 40 and r["bbox"][3] - r["bbox"][1] <= 2.5 * body
        return r["category"] == "Formula" or (r["category"] == "Text" and short)
    cand = [i for i, r in enumerate(regions) if piece(r)]
    parent = {i: i for i in cand}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for a_i, a in enumerate(cand):
        for b in cand[a_i + 1:]:
            if _near(regions[a]["bbox"], regions[b]["bbox"], 0.8 * body, 3 * body):
                parent[find(a)] = find(b)
    groups: dict[int, list[int]] = {}
    for i in cand:
        groups.setdefault(find(i), []).append(i)
    out, done = [], set()
    for i, r in enumerate(regions):
        if i in done:
            continue
        g = groups.get(find(i)) if i in parent else None
        if g and len(g) > 1 and any(regions[j]["category"] == "Formula" for j in g):
            parts = sorted((regions[j] for j in g), key=lambda q: (q["bbox"][1], q["bbox"][0]))
            out.append({"category": "Formula", "bbox": union_box(q["bbox"] for q in parts),
                        "text": " ".join(q["text"] for q in parts), "size": parts[0].get("size"), "rows": 1})
            done.update(g)
        else:
            out.append(r)
    return _attach_numbers(out)


def _attach_numbers(regions: list[dict]) -> list[dict]:
    """A Formula that is only its number "(3)" joins the Formula on its row however far (DocLayNet's
    box includes the number); a Formula inside another one joins it."""
    formulas = [r for r in regions if r["category"] == "Formula"]
    gone = set()
    for r in sorted(formulas, key=lambda q: len(q["text"])):
        b = r["bbox"]
        hosts = [o for o in formulas if o is not r and id(o) not in gone and not _EQ_NUMBER_START.match(o["text"])]
        if _EQ_NUMBER_START.match(r["text"]):
            hosts = [o for o in hosts if min(o["bbox"][3], b[3]) - max(o["bbox"][1], b[1]) > 0.3 * (b[3] - b[1])]
        else:
            hosts = [o for o in hosts if centre_inside(b, o["bbox"], tol=1.0)]
        if hosts:
            host = max(hosts, key=lambda o: min(o["bbox"][3], b[3]) - max(o["bbox"][1], b[1]))
            host["bbox"] = union_box([host["bbox"], b])
            host["text"] += " " + r["text"]
            gone.add(id(r))
    return [r for r in regions if id(r) not in gone]
