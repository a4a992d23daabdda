"""``train.compile_cache``: inductor's on-disk cache in a folder kept between runs (torch's default lives
under /tmp), so a second run on the same machine loads what the first compiled; ``false`` turns it off."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gsdistill.pretrain.step_compile import cache_folder, compiled_before, remember_compiled, use_compile_cache

ROOT = Path(__file__).resolve().parents[1]


def test_the_cache_folder_is_the_users_unless_moved_or_off(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder("auto") == tmp_path / "xdg" / "gsdistill" / "inductor"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder("auto") == tmp_path / "home" / ".cache" / "gsdistill" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's own setting wins
    assert cache_folder("auto") == cache_folder(True) == tmp_path / "mine"
    assert cache_folder(str(tmp_path / "here")) == tmp_path / "here"
    assert cache_folder(False) is None and cache_folder("off") is None


def test_the_setting_reaches_inductor(monkeypatch, tmp_path):
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.setattr(inductor_config, "force_disable_caches", inductor_config.force_disable_caches)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before")))
    assert use_compile_cache(str(tmp_path / "moved")) == tmp_path / "moved"
    assert cache_dir() == str(tmp_path / "moved") and (tmp_path / "moved").is_dir()
    assert not inductor_config.force_disable_caches and inductor_config.fx_graph_cache
    assert use_compile_cache(False) is None and inductor_config.force_disable_caches


def test_the_config_key_takes_a_folder_or_false():
    from gsdistill.config import load_config

    assert load_config("pretrain", None, [])["train"]["compile_cache"] == "auto"
    assert load_config("pretrain", None, ["train.compile_cache=off"])["train"]["compile_cache"] is False
    assert load_config("pretrain", None, ["train.compile_cache=/x/y"])["train"]["compile_cache"] == "/x/y"


_RUN = """
import json, sys, torch
from torch._dynamo.utils import counters
from gsdistill.pretrain.step_compile import use_compile_cache
use_compile_cache(sys.argv[1] if sys.argv[1] != "off" else False)
f = torch.compile(lambda x: torch.nn.functional.gelu(x @ x.T).sum(1))
f(torch.randn(8, 8))
print(json.dumps(dict(counters["inductor"])))
"""


def _compile_in_a_new_process(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", _RUN, setting], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_run_loads_the_first_runs_graph(tmp_path):
    """Two processes compile the same function: the first fills the folder, the second hits it (no new
    C++ kernels); with the cache off the second compiles again."""
    import shutil
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        pytest.skip("inductor needs a C++ compiler on the CPU")
    folder = tmp_path / "cache"
    first, second = _compile_in_a_new_process(str(folder)), _compile_in_a_new_process(str(folder))
    assert first.get("fxgraph_cache_miss", 0) >= 1 and not first.get("fxgraph_cache_hit")
    assert second.get("fxgraph_cache_hit", 0) >= 1 and not second.get("fxgraph_cache_miss")
    assert any(folder.rglob("*.py")) or any(folder.rglob("*.so"))
    off = _compile_in_a_new_process("off")
    assert not off.get("fxgraph_cache_hit")


def test_auto_counts_on_a_warm_cache_only_for_a_step_compiled_before(tmp_path, monkeypatch):
    """The engine notes in the cache folder that a step compiled (after its first compiled call, not after
    the checked eager one); ``auto`` then compiles that step from the warm threshold on: the same model,
    views and batch on the same device, not another batch size nor another folder."""
    import torch

    from gsdistill.losses.validation import checks
    from gsdistill.models.gsdistill_model import GSDistill
    from gsdistill.pretrain.engine_torch import TorchEngine, compile_min_steps, compile_wanted
    from test_pretrain_compile import _batch
    from test_pretrain_train import tiny

    cpu = torch.device("cpu")
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: None)  # the ledger, not the compiler
    folder = tmp_path / "cache"
    between = compile_min_steps("cpu", warm=True)  # >= warm, < cold
    cfg = tiny(f"optim.steps={between}", "train.compile=true", f"train.compile_cache={folder}")
    auto = tiny(f"optim.steps={between}", f"train.compile_cache={folder}")
    assert not compiled_before(cfg, cpu) and not compile_wanted(auto, cpu)
    engine = TorchEngine(GSDistill(cfg), cfg, cpu)
    with checks(True):
        engine.forward(_batch(cfg, 0, torch.float32))
    assert not compiled_before(cfg, cpu)  # the checked step ran eager: nothing compiled yet
    with checks(False):
        engine.forward(_batch(cfg, 1, torch.float32))
    assert compiled_before(cfg, cpu) and compiled_before(auto, cpu)  # train.compile is not part of the step
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert compile_wanted(auto, cpu)
    assert not compiled_before(tiny("optim.batch_size=2", f"train.compile_cache={folder}"), cpu)
    assert not compiled_before(tiny(f"train.compile_cache={tmp_path / 'other'}"), cpu)
    remember_compiled(tiny("train.compile_cache=false"), cpu)  # no cache: nothing to note, nothing fails
