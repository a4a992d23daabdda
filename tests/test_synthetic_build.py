"""The synthetic pages of a run without ``data.shards`` (``prepare_synthetic``, ``gsdistill demo``)
come from the parallel page-tuple builder on every core the process may use: the same pages as one
process makes, in at least one shard per reader (ranks x DataLoader workers) and per build worker."""
from __future__ import annotations

import pytest

from gsdistill.tuples.builder import engines as build_engines
from gsdistill.tuples.builder import synthetic_sets as synthetic_build
from gsdistill.tuples.store.reader import list_shards, read_pages
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.tuples.builder.synthetic_sets import build_synthetic, shard_count

PAGE = dict(seed=3, width=256, height=320, text_scale=1.5)


@pytest.mark.parametrize("pages,readers,workers,shards", [
    (4096, 8, 16, 16),  # gpu_vit_s16 on 16 cores: 16 shards of 256, 2 per reader
    (512, 8, 16, 16),
    (4096, 8, 2, 16),   # never above 256 pages a shard
    (10, 1, 2, 2),
    (10, 4, 2, 4),
    (5, 8, 16, 5),      # fewer pages than readers: one page each
])
def test_shard_count(pages, readers, workers, shards):
    assert shard_count(pages, readers, workers) == shards


def test_prepare_synthetic_builds_in_parallel_one_shard_per_reader(tmp_path, monkeypatch):
    from gsdistill.config import load_config
    from gsdistill.pretrain import run

    pools = []
    real_run_local = build_engines.run_local
    monkeypatch.setattr(build_engines, "run_local",
                        lambda jobs, workers: pools.append(workers) or real_run_local(jobs, workers))
    monkeypatch.setattr(synthetic_build, "available_cores", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(run, "embed_cached", lambda cfg, shard_dir: shard_dir)  # the text cache is tested elsewhere
    cfg = load_config("pretrain", None, ["data.synthetic_pages=12", "data.num_workers=3", "data.page_width=256",
                                         "data.page_height=320", "data.text_scale=1.5", "train.progress=false"])
    out = run.prepare_synthetic(cfg, tmp_path / "data")
    assert pools == [2]  # every core the process may use
    assert len(list_shards(out)) == 6  # 2 ranks x 3 workers: each reader streams 2 pages of one shard
    made = list(read_pages(out))
    expected = list(generate_pages(12, seed=0, width=256, height=320, text_scale=1.5))
    assert [p["id"] for p in made] == [p["id"] for p in expected]
    assert made[5]["spans"] == expected[5]["spans"] and made[5]["image"].size == (256, 320)


def test_any_worker_count_builds_the_same_shards(tmp_path):
    one = build_synthetic(9, tmp_path / "one", readers=2, workers=1, progress=False, **PAGE)
    two = build_synthetic(9, tmp_path / "two", readers=2, workers=2, progress=False, **PAGE)
    assert one["pages"] == two["pages"] == 9
    names = [f.name for f in list_shards(tmp_path / "one")]
    assert names == [f.name for f in list_shards(tmp_path / "two")] and len(names) >= 2
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
