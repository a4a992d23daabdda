"""What a GPU launch meets in its first second, tried on the CPU: the launcher's ``--local_rank``
before the command, one-line start-up errors naming the config key (pages for ranks x workers x
batch, a ``cuda`` config without a usable GPU, bf16 on a GPU without it), the fallback line of
``device: auto`` and the device/precision line every run prints."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from gsdistill import device as device_module
from gsdistill.cli import main, take_local_rank
from gsdistill.config import load_config
from gsdistill.errors import InputError
from gsdistill.pretrain import startup_checks


def test_deepspeed_launcher_local_rank_before_the_command_is_taken(monkeypatch):
    # what `deepspeed --module gsdistill.cli pretrain ...` runs on every rank
    done = subprocess.run([sys.executable, "-m", "gsdistill.cli", "--local_rank=0", "pretrain", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: gsdistill pretrain" in done.stdout
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert take_local_rank(["--local-rank", "3", "pretrain", "x=1"]) == ["pretrain", "x=1"]
    assert os.environ["LOCAL_RANK"] == "3"
    monkeypatch.setenv("LOCAL_RANK", "1")  # the launcher's own variable wins
    assert take_local_rank(["--local_rank=5", "eval"]) == ["eval"] and os.environ["LOCAL_RANK"] == "1"


def _stderr_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_too_few_pages_for_workers_fails_at_once_naming_num_workers(capsys):
    # the GPU recipe with the old 64 synthetic pages: 8 workers x 128 pages need 1,024
    assert main(["pretrain", "gpu_vit_s16", "data.synthetic_pages=64"]) == 2
    line = _stderr_line(capsys)
    assert "data.num_workers=8" in line and "data.synthetic_pages=64" in line and "1024" in line


def test_pages_for_ranks_x_workers_x_batch():
    cfg = load_config("pretrain", None, ["optim.batch_size=16", "data.num_workers=2"])
    startup_checks.check_pages(cfg, 2, 32, "data.synthetic_pages=32")  # 2 ranks x 2 workers x 8 pages
    with pytest.raises(InputError, match="data.num_workers=2"):
        startup_checks.check_pages(cfg, 2, 31, "data.synthetic_pages=31")


def test_gpu_recipe_has_pages_for_its_workers_and_asks_for_cuda():
    cfg = load_config("pretrain", "gpu_vit_s16")
    startup_checks.check_before_start(cfg, 1)
    assert cfg.train.device == "cuda" and load_config("pretrain", "vit_small_paper").train.device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable GPU")
def test_cuda_config_without_a_gpu_fails_at_once_naming_train_device(capsys):
    assert main(["pretrain", "gpu_vit_s16"]) == 2
    line = _stderr_line(capsys)
    assert "train.device=cuda" in line and "no CUDA device torch can use" in line and "train.device=cpu" in line


def test_bf16_on_a_gpu_without_bf16_fails_naming_train_precision(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-32GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    cfg = load_config("pretrain", None, ["train.precision=bf16"])
    with pytest.raises(InputError, match=r"train.precision=bf16: Tesla V100.*7\.0.*train.precision=fp32"):
        startup_checks.check_precision(cfg, torch.device("cuda", 0))
    startup_checks.check_precision(cfg, torch.device("cpu"))  # the CPU runs bf16 autocast


def test_auto_says_why_a_present_gpu_is_not_used(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_module, "nvidia_device_visible", lambda: True)
    monkeypatch.setattr(device_module, "_warned", set())
    monkeypatch.setattr(device_module, "cuda_unusable_reason",
                        lambda: "torch 2.x (built for CUDA 13.0): The NVIDIA driver on your system is too old")
    assert device_module.resolve_device("auto", key="train.device") == torch.device("cpu")
    assert device_module.resolve_device("auto", key="train.device") == torch.device("cpu")
    line = _stderr_line(capsys)  # once per process, not once per call
    assert "train.device=auto" in line and "CUDA 13.0" in line and "too old" in line and "CPU" in line


def test_auto_without_any_gpu_stays_quiet(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_module, "nvidia_device_visible", lambda: False)
    assert device_module.resolve_device("auto") == torch.device("cpu")
    assert capsys.readouterr().err == ""


def test_the_run_prints_device_and_precision_at_start(tmp_path, capsys):
    from gsdistill.pretrain.data_stream import FixedBatches, tensor_batch
    from gsdistill.pretrain.run import run_pretraining
    from test_pretrain_distributed import TINY

    cfg = load_config("pretrain", None, TINY + ["optim.steps=1", "train.device=cpu", "train.precision=bf16"])
    run_pretraining(cfg, tmp_path, lambda rank, world: FixedBatches([tensor_batch(cfg, 4)], rank, world))
    out = capsys.readouterr().out
    assert "[pretrain] device cpu, precision bf16, engine torch, 1 process(es)" in out
