"""Old import path of the PDF page builder, kept for user code: it lives in
:mod:`gsdistill.tuples.sources.pdf`."""
from gsdistill.tuples.sources.pdf import open_pdf, page_regions, pdf_pages, render

__all__ = ["open_pdf", "page_regions", "pdf_pages", "render"]
