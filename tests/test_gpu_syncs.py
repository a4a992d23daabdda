"""Host syncs of a pretraining step under several processes, and where HostSyncCounter puts them
(issue 22, rows 9 and 13).

Row 9: the sizes a step exchanges (pages per rank, texts per page, teacher rows) are known on the
host, so a 2-process step makes the same host syncs as a 1-process step: none in the model and the
losses once the value checks are off and the batch carries ``mask_index``. Checked in the default
suite with a fake 2-rank world (the collectives replaced by local copies, as open_clip's loss tests
do) and in the slow suite inside a real 2-process gloo step.

Row 13: a frame is the package's only when its file lies in the package's own folder, outside any
virtual environment: a clone named ``gsdistill`` holds ``gsdistill/.venv/.../torch``.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gsdistill
from gsdistill.config import load_config
from gsdistill.losses.syncs import HostSyncCounter
from gsdistill.losses.validation import checks
from gsdistill.pretrain.data_stream import host_indices
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import slice_batch, tensor_batch

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "views.mask_prob=0.5"]
PACKAGE = Path(gsdistill.__file__).resolve().parent.as_posix() + "/"
VARIANTS = {"default": [], "demo_heads": ["objective.symmetric=true", "objective.geom_target=mean",
                                          "objective.queue_size=8", "model.geom_pool_grid=2"],
            "visible_softmax": ["objective.align_views=visible", "objective.symmetric=true",
                                "objective.centering=softmax"]}


def _step_syncs(extra: list[str], rank: int = 0, world: int = 1) -> HostSyncCounter:
    """Syncs of one forward + backward after a first step with value checks on (as the loop runs)."""
    cfg = load_config("pretrain", None, TINY + extra)
    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    batch = slice_batch(tensor_batch(cfg, 4, seed=0), rank, world)
    batch.update(host_indices(batch["masks"]))  # the data pipeline's mask_index and masked_views, on the host
    model(batch)["total"].backward()
    with checks(False), HostSyncCounter() as syncs:
        model(batch)["total"].backward()
    return syncs


class _FakeWorld:
    """Rank 0 of 2 ranks that hold the same data: all_gather copies, SUM doubles, MAX keeps."""

    def __init__(self, monkeypatch):
        for name, value in (("is_available", lambda: True), ("is_initialized", lambda: True),
                            ("get_world_size", lambda group=None: 2), ("get_rank", lambda group=None: 0),
                            ("get_backend", lambda group=None: "gloo"),
                            ("all_gather", self.all_gather), ("all_reduce", self.all_reduce)):
            monkeypatch.setattr(dist, name, value)
        self.collectives = 0

    def all_gather(self, parts, tensor, group=None, async_op=False):
        self.collectives += 1
        for p in parts:
            p.copy_(tensor)

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        self.collectives += 1
        if op == dist.ReduceOp.SUM:
            tensor.mul_(2)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_two_rank_step_makes_the_syncs_of_one_rank(variant, monkeypatch):
    one = _step_syncs(VARIANTS[variant])
    assert one.total == 0, dict(one.where)
    world = _FakeWorld(monkeypatch)
    two = _step_syncs(VARIANTS[variant])
    assert world.collectives > 0  # the fake world was used
    assert two.total == one.total, dict(two.where)


def test_given_sizes_are_checked_while_checks_are_on(monkeypatch):
    from gsdistill.losses.gather import gather_with_grad
    _FakeWorld(monkeypatch)
    x = torch.ones(3, 2)
    assert gather_with_grad(x, [3, 3]).shape == (6, 2)
    with pytest.raises(ValueError, match=r"do not fit 2 ranks with 3 rows"):
        gather_with_grad(x, [4, 3])


def _fake_frame_sync(filename: str) -> HostSyncCounter:
    """A host sync made by code whose frames claim to live in ``filename``."""
    namespace: dict = {}
    exec(compile("def read(x):\n    return x.sum().item()\n", filename, "exec"), namespace)
    with HostSyncCounter() as syncs:
        namespace["read"](torch.ones(3))
    return syncs


def test_torch_inside_a_clone_named_gsdistill_is_not_the_package():
    syncs = _fake_frame_sync("/x/gsdistill/.venv/lib/python3.11/site-packages/torch/_tensor.py")
    assert syncs.total == 1
    assert syncs.inside("gsdistill/") == {}, dict(syncs.where)
    # a venv inside the package folder itself is not the package either; the package's files are
    assert _fake_frame_sync(PACKAGE + ".venv/lib/python3.11/site-packages/torch/x.py").inside("gsdistill/") == {}
    own = _fake_frame_sync(PACKAGE + "losses/fake_module.py")
    assert list(own.inside("gsdistill/losses/")) == ["_local_scalar_dense @ gsdistill/losses/fake_module.py:2"]


def test_package_path_names_only_the_package_folder():
    from gsdistill.losses.syncs import package_path
    root = "/x/gsdistill/gsdistill/"
    assert package_path("/x/gsdistill/.venv/lib/python3.11/site-packages/torch/nn/functional.py", root) is None
    assert package_path("/x/gsdistill/gsdistill/venv/lib/site-packages/torch/a.py", root) is None
    assert package_path("/y/gsdistill/losses/dino.py", root) is None  # another copy of the package
    assert package_path("/x/gsdistill/gsdistill/losses/dino.py", root) == "gsdistill/losses/dino.py"


# ---- the real thing: 2 gloo processes ------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        counts = {v: dict(_step_syncs(extra, rank, world).where) for v, extra in VARIANTS.items()}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(counts, f)


@pytest.mark.slow
@pytest.mark.distributed
def test_real_two_process_step_makes_the_syncs_of_one_process(tmp_path):
    one = {v: dict(_step_syncs(extra).where) for v, extra in VARIANTS.items()}
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        two = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert two == one == {v: {} for v in VARIANTS}, (rank, two)
