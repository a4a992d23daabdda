#!/usr/bin/env bash
# One set-up for README, CI and Dockerfile: apt packages (when root), a virtual environment in .venv,
# and the package with its dev extra. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
APT_PACKAGES="tesseract-ocr poppler-utils tesseract-ocr-grc tesseract-ocr-frk tesseract-ocr-deu tesseract-ocr-lat"
if [ "${GSDISTILL_TEXLIVE_DOCS:-0}" = "1" ]; then APT_PACKAGES="$APT_PACKAGES texlive-latex-base-doc"; fi
missing=""
for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = "0" ]; then
    echo "[setup] apt-get install$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "[setup] not root: please install$missing (OCR and PDF tests will skip without them)" >&2
  fi
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
# a newer dependency (pytrec_eval, ...) missing from an older .venv installs the package again
if ! .venv/bin/python -c "import gsdistill, torch, timm, ultralytics, deepspeed, pytrec_eval, zstandard, pytest, ray, onnxruntime, onnx" >/dev/null 2>&1; then
  echo "[setup] pip install -e .[dev] (first time: ~2-5 minutes, ~7 GB with CUDA torch)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev]"
fi
echo "[setup] ready: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu")')"
