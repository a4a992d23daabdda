"""DocBank regions: side-by-side pieces join, footnotes are Footnotes (real samples and small cases)."""
from __future__ import annotations

from collections import Counter

from gsdistill.tuples.sources.docbank import group_tokens, parse_tokens
from gsdistill.tuples.labels import to_doclaynet


def _tok(text, box, label):
    return {"text": text, "bbox": [float(v) for v in box], "label": label}


def test_pieces_side_by_side_on_a_row_are_one_region():
    body = [_tok(f"w{i}", (100 + 40 * (i % 10), 50 + 14 * (i // 10), 130 + 40 * (i % 10), 60 + 14 * (i // 10)), "paragraph")
            for i in range(30)]
    eq = [_tok("x", (300, 200, 320, 212), "equation"), _tok("=", (335, 202, 345, 210), "equation"),
          _tok("a+b", (360, 200, 420, 214), "equation"), _tok("(3)", (800, 202, 830, 212), "equation")]
    table = [_tok("##LTLine##", (150, 300, 700, 300), "table")]
    table += [_tok(f"c{r}{c}", (160 + 120 * c, 306 + 16 * r, 200 + 120 * c, 318 + 16 * r), "table")
              for r in range(3) for c in range(5)]
    regions = group_tokens(body + eq + table)
    by = Counter(r["label"] for r in regions)
    assert by == {"paragraph": 1, "equation": 1, "table": 1}
    (formula,) = [r for r in regions if r["label"] == "equation"]
    assert formula["bbox"] == [300.0, 200.0, 830.0, 214.0] and formula["text"] == "x = a+b (3)"
    (tab,) = [r for r in regions if r["label"] == "table"]
    assert tab["bbox"] == [150.0, 300.0, 700.0, 350.0]


def test_two_columns_of_paragraphs_stay_apart():
    left = [_tok(f"l{i}", (100 + 40 * (i % 8), 50 + 14 * (i // 8), 130 + 40 * (i % 8), 60 + 14 * (i // 8)), "paragraph")
            for i in range(24)]
    right = [_tok(f"r{i}", (520 + 40 * (i % 8), 50 + 14 * (i // 8), 550 + 40 * (i % 8), 60 + 14 * (i // 8)), "paragraph")
             for i in range(24)]
    regions = group_tokens(left + right)
    assert sorted(r["bbox"][0] for r in regions) == [100.0, 520.0]


def test_real_samples_have_whole_formulas_tables_and_footnotes(shared_data):
    root = shared_data / "docbank_samples" / "annotations"
    narrow = formulas = pages_with_footer = footnotes = nested = 0
    tables_per_page = []
    for txt in sorted(root.glob("*.txt")):
        tokens, _, _ = parse_tokens(txt)
        regions = group_tokens(tokens)
        cats = [(to_doclaynet(r["label"], "docbank"), r["bbox"]) for r in regions]
        f = [b for c, b in cats if c == "Formula"]
        formulas += len(f)
        narrow += sum(b[2] - b[0] < 30 for b in f)
        tables_per_page.append(sum(c == "Table" for c, _ in cats))
        pages_with_footer += any(t["label"] == "footer" for t in tokens)
        footnotes += sum(c == "Footnote" for c, _ in cats)
        texts = [b for c, b in cats if c == "Text"]
        nested += sum(1 for a in texts for b in texts if a is not b and b[0] <= a[0] and b[1] <= a[1]
                      and a[2] <= b[2] and a[3] <= b[3])
    # before the fix: 743 Formula boxes (356 narrower than 3 % of the page), up to 24 Table boxes on
    # one page, 59 Text boxes inside other Text boxes, 0 Footnotes
    assert formulas < 150 and narrow <= 2, (formulas, narrow)
    assert max(tables_per_page) <= 2 and nested == 0
    assert pages_with_footer == 10 and footnotes >= 10
