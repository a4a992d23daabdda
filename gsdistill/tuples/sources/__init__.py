"""Builders: one input kind -> page tuples (``gsdistill tuples build --from KIND``).

- ``pdf``: born-digital PDFs -> page tuples (pymupdf render, text blocks, layout regions);
- ``pdf_layout``: classes of a PDF page's text blocks (headers, captions, lists, formulas, ...);
- ``pdf_layout_blocks``: text-block fixes around that (splitting, line numbers, margins, footnotes);
- ``pdf_layout_graphics``: Table and Picture regions from a page's drawings and images;
- ``images``: page images without a text layer -> page tuples through OCR (Tesseract by default);
- ``coco``: COCO layout sets (DocLayNet, PubLayNet) -> page tuples;
- ``docbank``: DocBank token files -> page tuples with region boxes and spans;
- ``layout_eval``: per-class precision / recall / F1 of layout regions against ground truth;
- ``synthetic``: seeded synthetic pages with exact ground truth for all 11 classes;
- ``synthetic_draw``: tables and pictures drawn on synthetic pages;
- ``synthetic_text``: readable pseudo-text for synthetic pages (topics, sentence templates).
"""
