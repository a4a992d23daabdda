#!/usr/bin/env bash
# The README's test command: set up (idempotent), then the default test suite (slow tests excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/.cache/inductor}"  # compiled steps stay in the checkout
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 YOLO_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
