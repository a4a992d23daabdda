"""The Docker lines of the README and docs work as written: every ``docker run`` gives the container
enough shared memory for DataLoader workers, and every CUDA base image named is the CUDA the torch
wheel is built for."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "docs" / "gpu.md", REPO / "Dockerfile"]


def _command_lines(path: Path, command: str) -> list[str]:
    """Shell lines starting with ``command`` (continuation lines joined), from code blocks and comments."""
    text = path.read_text().replace("\\\n", " ")
    return [line.strip(" #") for line in text.splitlines() if line.strip(" #").startswith(command)]


def test_every_docker_run_line_gives_shared_memory():
    lines = [(p.name, line) for p in DOCS if p.is_file() for line in _command_lines(p, "docker run")]
    assert any(name == "README.md" for name, _ in lines)
    assert any("--gpus" in line for _, line in lines), "a CUDA docker run line is documented"
    for name, line in lines:
        assert re.search(r"--ipc[= ]host|--shm-size[= ]\S+", line), f"{name}: {line}"


def test_cuda_base_images_match_the_torch_wheel():
    if torch.version.cuda is None:
        pytest.skip("CPU-only torch: no CUDA to match")
    wheel = ".".join(torch.version.cuda.split(".")[:2])
    named = [(p.name, m) for p in DOCS if p.is_file() for m in re.findall(r"nvidia/cuda:(\d+\.\d+)", p.read_text())]
    assert any(name == "Dockerfile" for name, _ in named) and any(name == "README.md" for name, _ in named)
    assert all(version == wheel for _, version in named), (wheel, named)


def test_the_image_build_refuses_a_cuda_base_other_than_the_wheels():
    """The Dockerfile's own check, run here as the image runs it, with a mismatching base."""
    import os
    import subprocess
    import sys

    check = re.search(r'RUN \.venv/bin/python -c "(.*?)"\n', (REPO / "Dockerfile").read_text().replace("\\\n", ""), re.S)
    assert check, "the Dockerfile checks the base image's CUDA"
    code = check.group(1)
    wrong = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CUDA_VERSION": "12.6.3"},
                           capture_output=True, text=True)
    if torch.version.cuda is not None:
        assert wrong.returncode != 0 and "base image CUDA 12.6.3" in wrong.stderr
    ok = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CUDA_VERSION": f"{torch.version.cuda}.0"},
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
