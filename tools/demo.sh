#!/usr/bin/env bash
# The README's main-job command: set up (idempotent), then the whole pipeline on the embedded
# synthetic data (`gsdistill demo`); extra arguments go to it (e.g. --pdfs DIR, --size smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 YOLO_OFFLINE=1
exec .venv/bin/gsdistill demo "$@"
