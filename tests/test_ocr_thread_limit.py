"""OCR limits Tesseract to one OpenMP thread without leaving OMP_THREAD_LIMIT in this process's environment
(every process started later inherited it, and torch's bf16 CPU kernels then returned NaN)."""
import os
import sys
import types

from PIL import Image

from gsdistill.tuples.sources import images


def test_thread_limit_reaches_tesseract_only(monkeypatch):
    seen = {}

    def image_to_data(image, lang, config, output_type):
        seen["limit"] = os.environ.get("OMP_THREAD_LIMIT")
        return {"text": ["word"], "conf": ["90"], "left": [1], "top": [2], "width": [30], "height": [10],
                "block_num": [1], "par_num": [1], "line_num": [1]}

    fake = types.SimpleNamespace(image_to_data=image_to_data, Output=types.SimpleNamespace(DICT="dict"))
    monkeypatch.setitem(sys.modules, "pytesseract", fake)
    monkeypatch.setattr(images, "tesseract_available", lambda: True)
    monkeypatch.delenv("OMP_THREAD_LIMIT", raising=False)
    words = images.tesseract_ocr(Image.new("RGB", (2000, 100), "white"))
    assert seen["limit"] == "1" and "OMP_THREAD_LIMIT" not in os.environ
    assert words[0]["text"] == "word"
    monkeypatch.setenv("OMP_THREAD_LIMIT", "3")  # a user's own setting is kept, during and after
    images.tesseract_ocr(Image.new("RGB", (2000, 100), "white"))
    assert seen["limit"] == "3" and os.environ["OMP_THREAD_LIMIT"] == "3"
