#!/usr/bin/env bash
# Issue 64's proof on human labels: `gsdistill demo --coco` on GT4HistComment's 371 hand-labelled page scans of
# 8 books (../shared/data/gt4histcomment_layout, SOURCE.md), the recipe configs/demo/labelled.yaml: OCR in Greek,
# Fraktur and English (grc+frk+eng, scans at a long side of 1,600 px), 2 whole books held out, the six coarse
# zones (the part of each name before ':'), head-only detection on the pretrained backbone vs its random twin vs a stock YOLOv10n, at 100 % and at 20 %
# of the training pages. Report: runs/labelled_pages_bench/report.md; numbers in docs/detection.md
# ("Human-labelled pages"). The OCR pass is cached (runs/labelled_cache): a second run starts at pretraining.
#   COCO=FILE IMAGES=DIR  other labelled pages (default: the GT4HistComment set)
#   OUT=DIR               output folder (default: runs/labelled_pages_bench)
#   WORKERS=N             OCR processes (default 2)
#   extra arguments go to `gsdistill demo` (e.g. --class-map FILE, key=value overrides).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${GSDISTILL_SHARED_DATA:-$(cd .. && pwd)/shared/data}
COCO=${COCO:-$SHARED/gt4histcomment_layout/coco.json}
IMAGES=${IMAGES:-$SHARED/gt4histcomment_layout/images}
if [ ! -f "$COCO" ]; then echo "no labelled pages at $COCO (set COCO=FILE IMAGES=DIR)" >&2; exit 2; fi
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 YOLO_OFFLINE=1
exec .venv/bin/python -m gsdistill.cli demo --coco "$COCO" --images "$IMAGES" --class-map coarse \
  --workers "${WORKERS:-2}" --out "${OUT:-runs/labelled_pages_bench}" \
  labelled.ocr_lang=grc+frk+eng labelled.ocr_long_side=1600 labelled.ocr_min_width=900 labelled.cache_dir=runs/labelled_cache "$@"
