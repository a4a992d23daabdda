"""One ``threads`` setting per stage: the automatic count, torch's setting, and every CLI applying it."""
from __future__ import annotations

import os

import pytest
import torch

from gsdistill import threads


@pytest.fixture()
def restore_threads():
    before, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    yield
    torch.set_num_threads(before)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env


def test_default_divides_the_allowed_cores_among_ranks_and_workers(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert threads.available_cores() == 8
    assert [threads.default_threads(w) for w in (0, 1, 3, 7, 20)] == [8, 4, 2, 1, 1]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun: two ranks share the machine's cores
    assert [threads.default_threads(w) for w in (0, 1)] == [4, 2]


def test_apply_sets_torch_and_the_environment(restore_threads, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert threads.apply_threads(2) == 2 and torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
    assert threads.apply_threads(None) == 3 and torch.get_num_threads() == 3
    assert threads.apply_threads(None, workers=2) == 1 and torch.get_num_threads() == 1


def test_ultralytics_device_selection_keeps_the_setting(restore_threads):
    from ultralytics.utils.torch_utils import select_device
    threads.apply_threads(1, ultralytics=True)
    select_device("cpu", verbose=False)  # resets torch to Ultralytics' own count unless pinned
    assert torch.get_num_threads() == 1


class Applied(Exception):
    """Raised by the fake apply_threads: the stage got as far as applying its setting."""


@pytest.mark.parametrize("module,argv,workers", [
    ("gsdistill.tuples.cli", ["build", "--from", "synthetic", "1", "--out", "unused"], 0),
    ("gsdistill.pretrain.cli", ["data.num_workers=2"], 2),
    ("gsdistill.detect.cli", ["train", "workers=3"], 3),
    ("gsdistill.eval.cli", ["retrieval", "--model", "m", "--pages", "p"], 0),
    ("gsdistill.retriever.cli", ["train"], 0),
    ("gsdistill.pipelines.ablate", [], 0),
    ("gsdistill.pipelines.demo", [], 0),
])
def test_every_stage_cli_applies_its_threads_setting(monkeypatch, module, argv, workers):
    import importlib
    calls = []

    def fake(n, workers=0, ultralytics=False, torch_too=True):
        calls.append((n, workers))
        raise Applied()
    monkeypatch.setattr(threads, "apply_threads", fake)
    with pytest.raises(Applied):
        importlib.import_module(module).main([*argv, "threads=3"])
    assert calls == [(3, workers)]


def test_apply_without_torch_sets_only_the_environment(monkeypatch):
    """``tuples build`` needs no torch: applying its setting must not import it (serial start-up)."""
    import subprocess
    import sys
    code = ("import sys, os; from gsdistill.threads import apply_threads; apply_threads(2, torch_too=False); "
            "print('torch' in sys.modules, os.environ['OMP_NUM_THREADS'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "2"]


class _WorkerThreads(torch.utils.data.IterableDataset):
    def __iter__(self):
        import cv2
        yield torch.tensor([torch.get_num_threads(), cv2.getNumThreads()])


def test_data_workers_limit_torch_and_opencv_threads():
    """Each DataLoader worker of the pretraining stream runs torch AND OpenCV on its share of the
    cores (OpenCV otherwise starts a pool as large as the machine in every worker)."""
    import functools

    import cv2
    cv2.setNumThreads(4)  # the parent's pool: a forked worker inherits it unless the init limits it
    init = functools.partial(threads.limit_worker_threads, 1)
    loader = torch.utils.data.DataLoader(_WorkerThreads(), batch_size=None, num_workers=1, worker_init_fn=init)
    assert next(iter(loader)).tolist() == [1, 1]
    plain = torch.utils.data.DataLoader(_WorkerThreads(), batch_size=None, num_workers=1)
    assert next(iter(plain)).tolist()[1] > 1  # without it OpenCV keeps its pool: the test can fail


def test_shard_stream_installs_the_worker_thread_limit(monkeypatch, tmp_path):
    from gsdistill.pretrain import data_stream
    seen = {}

    class Loader:
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)

        def __iter__(self):
            return iter(())

    monkeypatch.setattr(torch.utils.data, "DataLoader", Loader)
    monkeypatch.setattr(threads, "available_cores", lambda: 6)
    stream = data_stream.ShardBatches.__new__(data_stream.ShardBatches)
    stream.workers, stream.pin_memory = 2, False
    stream.epochs = type("E", (), {"per_reader": lambda self, readers: 1})()
    stream._open({"epoch": 0, "batch": 0})
    assert seen["worker_init_fn"].func is threads.limit_worker_threads
    assert seen["worker_init_fn"].args == (2,)  # 6 cores / (main + 2 workers)
