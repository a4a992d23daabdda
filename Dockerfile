# gsdistill environment, built through the same set-up script as the README (tools/setup.sh).
#   CPU (default):  docker build -t gsdistill .
#   CUDA:           docker build -t gsdistill:cuda --build-arg BASE_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04 .
# The CUDA base must be the CUDA the torch wheel is built for (PyPI's torch: 13.0, which needs an
# NVIDIA driver >= 580); the build stops below when they differ. The wheel brings its own cuDNN.
# Run with --ipc=host (or --shm-size=16g): DataLoader workers hand batches over in /dev/shm, and one
# GPU batch (~270 MB) is more than Docker's default 64 MB, a bus error at the first batch.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 YOLO_OFFLINE=1
# python3-venv for CUDA base images that ship no Python; libgl/libglib for OpenCV (albumentations, ultralytics)
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
        python3 python3-venv python3-dev gcc g++ git libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/gsdistill
COPY . .
RUN PYTHON=python3 bash tools/setup.sh && rm -rf /var/lib/apt/lists/*
# nvidia/cuda images set CUDA_VERSION (e.g. 13.0.0); a CPU base sets none
RUN .venv/bin/python -c "import os, torch; base = os.environ.get('CUDA_VERSION', ''); wheel = torch.version.cuda or ''; \
    assert not base or base.startswith(wheel + '.'), f'base image CUDA {base} but torch {torch.__version__} is built for CUDA {wheel}: use nvidia/cuda:{wheel}.x'"
ENV PATH=/opt/gsdistill/.venv/bin:$PATH TORCH_EXTENSIONS_DIR=/opt/gsdistill/.cache/torch_extensions
ENTRYPOINT ["gsdistill"]
CMD ["--help"]
