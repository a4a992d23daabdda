#!/usr/bin/env bash
# The long real-page benchmark of issue 21 (about 2 hours on 2 CPU cores): the demo's real-page recipe at a
# larger budget (configs/demo/pdfs_long.yaml) on Debian's texlive documentation, ~300 real LaTeX-typeset
# PDFs (8 pages of each: ~1,100 pretraining and ~700 held-out pages of other documents), with the
# human-labelled pages of ../shared/data (DocBank samples, PubLayNet examples) scored by the same detectors.
# Report: runs/real_pages_bench/report.md; its numbers are tabled in docs/learning.md ("Real documents").
#   PDFS=DIR      another folder of PDFs (default: /usr/share/doc/texlive-doc, installed here as root)
#   EXTRA_PDFS=DIR  PDFs of other documents whose pages also train the detection heads (`detect_extra_pdfs`; none by
#                 default: 483 PDFs of two more texlive packages, tools/experiments/fetch_extra_pdfs.sh, cost held-out tables
#                 16 AP@50 points, docs/learning.md "Labelled pages of other documents for the head")
#   OUT=DIR       output folder (default: runs/real_pages_bench)
#   extra arguments go to `gsdistill demo` as key=value overrides.
set -euo pipefail
cd "$(dirname "$0")/../.."
PDFS=${PDFS:-/usr/share/doc/texlive-doc}
if [ "$PDFS" = /usr/share/doc/texlive-doc ]; then export GSDISTILL_TEXLIVE_DOCS=1; fi
bash tools/setup.sh
if [ ! -d "$PDFS" ]; then echo "no PDF folder at $PDFS (install texlive-latex-base-doc as root, or set PDFS=DIR)" >&2; exit 2; fi
SHARED=${GSDISTILL_SHARED_DATA:-$(cd .. && pwd)/shared/data}
args=()
if [ -d "$SHARED" ]; then args=("human_labels=$SHARED"); else echo "[bench] no $SHARED: human-labelled pages skipped" >&2; fi
if [ -n "${EXTRA_PDFS:-}" ]; then args+=("detect_extra_pdfs=$EXTRA_PDFS"); fi
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 YOLO_OFFLINE=1
exec .venv/bin/gsdistill demo --pdfs "$PDFS" --size pdfs_long --out "${OUT:-runs/real_pages_bench}" "${args[@]}" "$@"
