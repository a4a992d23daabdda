"""The shard stream keeps one DataLoader, and its workers, for the whole run: no worker start-up at
each epoch, the same batches in the same order as one DataLoader per epoch would give, and a
restored stream goes on exactly where it stopped (mid-round, mid-epoch and at an epoch's end)."""
from __future__ import annotations

import pytest

from gsdistill.config import load_config
from gsdistill.pretrain.data_stream import ShardBatches
from test_pretrain_data import TINY, _same

WORKERS, LOCAL_BATCH = 2, 2


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from gsdistill.pretrain.run import prepare_synthetic
    cfg = load_config("pretrain", None, TINY + [f"data.num_workers={WORKERS}", "data.synthetic_pages=9"])
    return prepare_synthetic(cfg, tmp_path_factory.mktemp("loader") / "data"), cfg


def _worker_pids(stream: ShardBatches) -> list[int]:
    return [w.pid for w in stream._it._workers]


def test_workers_live_across_epochs_and_every_page_comes_once_an_epoch(shards):
    shard_dir, cfg = shards
    stream = ShardBatches(str(shard_dir), cfg, 0, 1, LOCAL_BATCH, 16)
    first = next(stream)
    loader, pids = stream._it, _worker_pids(stream)
    # 9 pages over 2 workers: 4 and 5, so 2 whole batches each; 4 batches an epoch
    epoch0 = [first] + [next(stream) for _ in range(3)]
    assert stream.position == {"epoch": 0, "batch": 4}
    ids = [i for b in epoch0 for i in b["ids"]]
    assert len(ids) == len(set(ids)) == 8
    later = [next(stream) for _ in range(6)]
    assert stream.position == {"epoch": 2, "batch": 2}
    assert stream._it is loader and _worker_pids(stream) == pids  # the same workers, epoch after epoch
    assert not _same(epoch0[0], later[0]), "a new epoch reshuffles and redraws the views"


@pytest.fixture(scope="module")
def run(shards) -> list[dict]:
    stream = ShardBatches(str(shards[0]), shards[1], 0, 1, LOCAL_BATCH, 16)
    return [next(stream) for _ in range(10)]


@pytest.mark.parametrize("position", [{"epoch": 0, "batch": 1}, {"epoch": 1, "batch": 3},
                                      {"epoch": 0, "batch": 4}, {"epoch": 1, "batch": 2}])
def test_a_restored_stream_goes_on_with_the_same_batches(shards, run, position):
    shard_dir, cfg = shards
    k = position["epoch"] * 4 + position["batch"]
    fresh = ShardBatches(str(shard_dir), cfg, 0, 1, LOCAL_BATCH, 16)
    fresh.restore(position)
    for expected in run[k:k + 3]:
        assert _same(next(fresh), expected), position

