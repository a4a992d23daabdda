"""Process-group timeouts: the run passes ``train.dist_timeout_minutes`` to the group, and the ranks
waiting for rank 0 to prepare the data wait on their own group, past the main group's timeout
(2 gloo processes; on GPUs the main group is NCCL, whose default timeout is 10 minutes)."""
from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gsdistill.pretrain import distributed

MAIN_TIMEOUT_S, PREPARE_S = 3, 6


def test_the_group_gets_the_configured_timeout(monkeypatch):
    seen = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: seen.update(kwargs))
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    distributed.setup("torch", "cpu", timedelta(minutes=45))
    assert seen == {"backend": "gloo", "timeout": timedelta(minutes=45)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slow_prepare() -> str:
    time.sleep(PREPARE_S)
    return "shards-ready"


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    distributed.join_from_env(torch.device("cpu"), timeout=timedelta(seconds=MAIN_TIMEOUT_S))
    got = distributed.rank0_then_all(_slow_prepare, wait=timedelta(minutes=5))
    late_main = "finished"
    try:  # the same wait on the main group: rank 1 gives up after MAIN_TIMEOUT_S
        if rank == 0:
            time.sleep(PREPARE_S)
        box = ["x" if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
    except RuntimeError:
        late_main = "timed out"
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{got}\n{late_main}\n")
    os._exit(0)  # the timed-out group cannot be torn down cleanly


@pytest.mark.distributed
def test_ranks_wait_for_rank0_data_past_the_group_timeout(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path / "out")), nprocs=2, join=True)
    results = [(tmp_path / f"out.{r}").read_text().split("\n") for r in (0, 1)]
    assert [r[0] for r in results] == ["shards-ready", "shards-ready"]
    assert results[1][1] == "timed out"  # the main group's timeout is real: the wait had to avoid it
