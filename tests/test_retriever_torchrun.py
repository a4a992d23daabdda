"""`gsdistill retriever train` under torchrun (issue 22, row 8): each rank on its own device, one run
folder for all ranks, files written by rank 0 alone, the mined-negative cache written atomically.

The fast tests fake the second rank (the broadcast replaced by a local copy); the slow one runs the
real ``torchrun --nproc_per_node 2`` on the CPU (gloo) for a tiny run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gsdistill.retriever import mining, pipeline
from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.model import DualEncoder
from retriever_fixtures import retriever_cfg, tiny_beir, tiny_encoder  # noqa: F401  (fixtures)


def test_each_rank_makes_its_local_cuda_device_current(monkeypatch):
    from gsdistill.retriever.train_support import init_distributed
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: current.append(torch.device(device)))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "1")  # the device is set; no process group is joined alone
    assert init_distributed("auto") is False
    assert current == [torch.device("cuda", 1)]


def test_mined_negative_cache_is_written_by_one_rename(tmp_path, monkeypatch):
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renames.append((Path(src), Path(dst))),
                                                          real_replace(src, dst))[1])
    key = {"settings": {"method": "bm25"}}
    lists, path, reused = mining.cached_negatives(tmp_path, key, lambda: {"q1": [3, 4]})
    assert not reused and json.loads(path.read_text()) == {"key": key, "negatives": {"q1": [3, 4]}}
    assert len(renames) == 1 and renames[0][1] == path and renames[0][0].parent == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left
    # a failure while writing leaves neither a half file nor a temporary one
    with pytest.raises(TypeError):
        mining.cached_negatives(tmp_path / "bad", {"k": 1}, lambda: {"q1": [object()]})
    assert list((tmp_path / "bad").iterdir()) == []


class _Rank1:
    """This process plays rank 1 of 2; ``broadcast_object_list`` hands over what rank 0 sent."""

    def __init__(self, monkeypatch, sent):
        self.sent = list(sent)
        monkeypatch.setattr(dist, "is_available", lambda: True)
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(dist, "broadcast_object_list", self.broadcast)

    def broadcast(self, box, src=0, group=None, device=None):
        assert src == 0
        box[0] = self.sent.pop(0)


def test_rank1_takes_rank0s_run_folder_and_lists_and_writes_nothing(tiny_beir, tiny_encoder, tmp_path, monkeypatch):
    cfg = retriever_cfg(tiny_beir, tmp_path, f"model.encoder={tiny_encoder}", "run.name=null",
                        "negatives.method=bm25", "negatives.per_query=2")
    data = load_beir(tiny_beir)
    model = DualEncoder(tiny_encoder, query_max_length=16, passage_max_length=32)
    rank0_lists = {q: [0, 1] for q in data.judged_queries()}
    rank0_file = tmp_path / "mined_negatives" / "from_rank0.json"
    _Rank1(monkeypatch, [(rank0_lists, rank0_file, False)])
    pipeline.report_data({"train": data}, tmp_path / "run")
    mined, info, _ = pipeline.mine_for_run(cfg, data, data.qrels, model, None, progress=False)
    assert mined == rank0_lists and info["file"] == str(rank0_file)
    assert [p.name for p in tmp_path.iterdir()] == ["beir"]  # neither the data summary nor a cache file


def test_rank1_names_its_run_folder_as_rank0_does(tmp_path, monkeypatch, tiny_beir):
    cfg = retriever_cfg(tiny_beir, tmp_path, "run.name=null")
    _Rank1(monkeypatch, ["sum_marg_lh-20240101-000000"])
    assert pipeline.make_run_dir(cfg) == tmp_path / "sum_marg_lh-20240101-000000"


@pytest.mark.slow  # torchrun with 2 CPU processes: ~1 min on 2 shared cores
@pytest.mark.distributed
def test_real_torchrun_two_ranks_share_one_run_folder(tiny_beir, tiny_encoder, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    runs = tmp_path / "runs"
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "gsdistill.cli", "retriever", "train",
           f"data.path={tiny_beir}", f"run.dir={runs}", f"model.encoder={tiny_encoder}", "model.query_max_length=16",
           "model.passage_max_length=32", "train.batch_size=2", "train.epochs=2", "train.ckpt_every=2",
           "train.device=cpu", "threads=1", "negatives.method=bm25", "negatives.per_query=2", "eval.k=20",
           "data.folds=3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    folders = sorted(p.name for p in runs.iterdir())
    assert len(folders) == 2 and "mined_negatives" in folders, folders  # one run folder for both ranks
    run = runs / next(f for f in folders if f != "mined_negatives")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["negatives"]["reused_cache"] is False and Path(summary["negatives"]["file"]).is_file()
    assert [p.suffix for p in (runs / "mined_negatives").iterdir()] == [".json"]  # no temporary file left
    assert (run / "data_summary.json").is_file() and (run / "model").is_dir()
    ckpts = sorted((run / "checkpoints").glob("step-*"))
    assert ckpts and {p.name for p in ckpts[-1].glob("rng-rank*.pt")} == {"rng-rank0.pt", "rng-rank1.pt"}
