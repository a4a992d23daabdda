"""Pretraining on real page tuples: the shard stream resumes exactly, and a run from synthetic shards works."""
from __future__ import annotations

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.pretrain.metrics_log import read_metrics

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "optim.batch_size=4", "optim.steps=3", "train.log_every=1", "train.progress=false",
        "train.tensorboard=false", "train.plots=false", "data.synthetic_pages=10", "data.page_width=256",
        "data.page_height=320", "data.shuffle_buffer=4"]


@pytest.fixture(scope="module")
def synthetic_shards(tmp_path_factory):
    from gsdistill.pretrain.run import prepare_synthetic
    cfg = load_config("pretrain", None, TINY)
    return prepare_synthetic(cfg, tmp_path_factory.mktemp("pretrain_data") / "data"), cfg


def _same(a: dict, b: dict) -> bool:
    return a["ids"] == b["ids"] and all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))


def test_shard_stream_restores_position_across_epochs(synthetic_shards):
    from gsdistill.pretrain.data_stream import ShardBatches
    shard_dir, cfg = synthetic_shards
    stream = ShardBatches(str(shard_dir), cfg, 0, 1, 4, 16)
    batches = [next(stream) for _ in range(5)]  # 10 pages, 4 per batch: 2 per epoch, 3 epochs touched
    assert stream.position == {"epoch": 2, "batch": 1}
    assert batches[0]["global_crops"].shape == (8, 3, 32, 32) and batches[0]["masks"].shape == (8, 4)
    assert batches[0]["sem_emb"].shape[-1] == 384
    assert not _same(batches[0], batches[2]), "a new epoch reshuffles and redraws the views"
    for k, position in ((1, {"epoch": 0, "batch": 1}), (3, {"epoch": 1, "batch": 1}), (4, {"epoch": 2, "batch": 0})):
        fresh = ShardBatches(str(shard_dir), cfg, 0, 1, 4, 16)
        fresh.restore(position)
        assert _same(next(fresh), batches[k]), position


def test_shard_stream_splits_pages_over_ranks(synthetic_shards):
    from gsdistill.pretrain.data_stream import ShardBatches
    shard_dir, cfg = synthetic_shards
    ids = [set(next(ShardBatches(str(shard_dir), cfg, r, 2, 2, 16))["ids"]) for r in (0, 1)]
    assert ids[0] and ids[1] and not ids[0] & ids[1]


def test_pretraining_from_given_shards_end_to_end(tmp_path, synthetic_shards):
    from gsdistill.pretrain.checkpoint import load_pretrained
    from gsdistill.pretrain.run import run_pretraining
    cfg = load_config("pretrain", None, TINY + [f"data.shards={synthetic_shards[0]}"])
    run_dir = run_pretraining(cfg, tmp_path)  # the fixture's text cache matches: reused, not rebuilt
    assert not (run_dir / "data").exists()
    rows = read_metrics(run_dir / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert {"sem", "geom", "distill", "ibot", "koleo", "total", "grad_norm", "lr"} <= set(rows[0])
    model = load_pretrained(run_dir)
    assert model.embed_pages(torch.zeros(1, 3, 32, 32)).shape == (1, 32)


def falling(rows: list[dict], term: str, share: float = 0.2) -> tuple[float, float]:
    """Mean of the term over the first and the last ``share`` of the logged steps."""
    values = [float(r[term]) for r in rows]
    n = max(1, int(len(values) * share))
    return sum(values[:n]) / n, sum(values[-n:]) / n


@pytest.mark.slow
def test_embedded_default_demo_every_loss_term_falls(tmp_path):
    """``gsdistill pretrain`` with no data argument: synthetic pages, full objective, < 10 min on 2 cores."""
    from gsdistill.cli import main
    assert main(["pretrain", "--run-dir", str(tmp_path), "train.progress=false"]) == 0
    rows = read_metrics(tmp_path / "metrics.csv")
    for term in ("sem", "geom", "distill", "ibot", "koleo", "total"):
        first, last = falling(rows, term)
        assert last < first, f"{term}: {first:.4f} -> {last:.4f}"
    assert (tmp_path / "backbone" / "backbone.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_two_processes_on_synthetic_shards(tmp_path):
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "gsdistill.cli", "pretrain", "--run-dir", str(tmp_path), *TINY, "train.progress=false"]
    env = dict(__import__("os").environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert (tmp_path / "backbone" / "backbone.json").is_file()
