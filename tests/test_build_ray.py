"""The Ray engine writes the same shards as a one-process build: on a real local cluster of 2 workers
(~8 s, most of it Ray starting) and through a stand-in of Ray's task API that hands results back in
reverse order. The core install works without Ray and says which extra to add."""
from __future__ import annotations

import signal
import sys
import time

import pytest

from gsdistill.tuples.builder import engines as build_engines
from gsdistill.tuples.builder.driver import build_shards
from gsdistill.tuples.errors import DataError
from test_build_parallel import cfg, output_of

SETTINGS = ["build.pages_per_shard=4", "build.engine=ray"]


class StandInRay:
    """Ray's task API as ``run_ray`` uses it; ``wait`` returns the newest pending task first, so
    results arrive out of unit order; every option a task was given is kept for the test."""

    def __init__(self):
        self.initialized, self.options, self.init_args = False, [], None

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.initialized, self.init_args = True, kwargs

    def shutdown(self):
        self.initialized = False

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, **options):
                ray.options.append(options)
                return self

            def remote(self, job):
                return lambda: fn(job)
        return Task()

    def wait(self, pending, num_returns):
        return pending[-num_returns:], pending[:-num_returns]

    def get(self, ref):
        return ref()


def test_ray_path_with_a_stand_in_matches_the_local_build(tmp_path, monkeypatch):
    ray, original = StandInRay(), build_engines.run_ray
    monkeypatch.setattr(build_engines, "run_ray", lambda *args: original(*args, ray=ray))
    build_shards("synthetic", "14", tmp_path / "ray", cfg(*SETTINGS, "build.max_retries=5", "build.workers=2"))
    build_shards("synthetic", "14", tmp_path / "local", cfg("build.pages_per_shard=4", "build.workers=1"))
    assert output_of(tmp_path / "ray") == output_of(tmp_path / "local")
    assert ray.options == [{"num_cpus": 1, "max_retries": 5, "retry_exceptions": True}]
    assert ray.init_args == {"num_cpus": 2, "include_dashboard": False} and not ray.initialized  # started, then shut


def test_without_ray_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(DataError, match=r"gsdistill\[ray\]"):
        build_shards("synthetic", "4", tmp_path / "out", cfg(*SETTINGS))


def test_real_ray_cluster_of_two_workers_matches_the_local_build(tmp_path):
    ray = pytest.importorskip("ray", reason="the dev extra installs Ray; a core install has none")
    before = signal.getsignal(signal.SIGTERM)
    start = time.time()
    build_shards("synthetic", "14", tmp_path / "ray", cfg(*SETTINGS, "build.workers=2"))  # starts a local cluster
    print(f"ray build with start-up: {time.time() - start:.1f} s")
    assert not ray.is_initialized()
    # ray.init installs its own SIGTERM handler and ray.shutdown leaves it: the build puts the old one back
    assert signal.getsignal(signal.SIGTERM) is before
    build_shards("synthetic", "14", tmp_path / "local", cfg("build.pages_per_shard=4", "build.workers=1"))
    assert output_of(tmp_path / "ray") == output_of(tmp_path / "local")
