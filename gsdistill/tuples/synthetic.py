"""Old import path of the synthetic page generator, kept for user code: it lives in
:mod:`gsdistill.tuples.sources.synthetic`."""
from gsdistill.tuples.sources.synthetic import generate_pages, render_page

__all__ = ["generate_pages", "render_page"]
