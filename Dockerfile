# gsdistill environment, built through the same set-up script as the README (tools/setup.sh).
#   CPU (default):  docker build -t gsdistill .
#   CUDA:           docker build -t gsdistill:cuda --build-arg BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04 .
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
ENV PATH=/opt/gsdistill/.venv/bin:$PATH TORCH_EXTENSIONS_DIR=/opt/gsdistill/.cache/torch_extensions
ENTRYPOINT ["gsdistill"]
CMD ["--help"]
