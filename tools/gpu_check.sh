#!/usr/bin/env bash
# One command for a machine with GPUs: CUDA tests, a short bf16 ViT-S/16 run of each engine (and on
# 2 GPUs when there are 2), one epoch of head-only detection, and a markdown table
# (runs/gpu_check/gpu_check.md). `--cpu`: the same at tiny sizes on the CPU, as CI runs it.
#   bash tools/gpu_check.sh [--cpu] [--steps N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 YOLO_OFFLINE=1
exec .venv/bin/python tools/gpu/gpu_check.py "$@"
