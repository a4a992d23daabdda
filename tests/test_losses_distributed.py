"""A real 2-process gloo run: gathered-candidate losses and world-aware Sinkhorn equal one process."""
from __future__ import annotations

import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gsdistill.losses import gather_with_grad, get_loss, rank_offset, sinkhorn_knopp
from gsdistill.losses.dino import DINOLoss

WORLD = 2
N_QUERIES = 6          # 3 anchors per rank
DOC_SPLIT = [4, 7]     # uneven candidate counts per rank
LOSS_NAMES = ["mpcl", "joint_lh", "lse_pair", "single_lh", "bce"]


def make_batch():
    g = torch.Generator().manual_seed(0)
    queries = torch.randn(N_QUERIES, 5, generator=g, dtype=torch.float64)
    docs = torch.randn(sum(DOC_SPLIT), 5, generator=g, dtype=torch.float64)
    positives = torch.rand(N_QUERIES, sum(DOC_SPLIT), generator=g) < 0.3
    positives[torch.arange(N_QUERIES), torch.arange(N_QUERIES)] = True
    teacher = torch.randn(10, 16, generator=g, dtype=torch.float64) * 3
    return queries, docs, positives, teacher


def full_batch_reference():
    queries, docs, positives, teacher = make_batch()
    out = {}
    for name in LOSS_NAMES:
        q = queries.clone().requires_grad_(True)
        d = docs.clone().requires_grad_(True)
        loss = get_loss(name)(4.0 * q @ d.t(), positives)
        loss.backward()
        out[name] = (loss.detach(), q.grad, d.grad)
    out["sinkhorn"] = sinkhorn_knopp(teacher, 0.5, 3)
    centre = DINOLoss(16)
    centre.teacher_probs(teacher, 0.5, centering="softmax")
    out["center"] = centre.center.clone()
    return out


def worker(rank: int, port: int, result_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        queries, docs, positives, teacher = make_batch()
        q_rows = slice(rank * 3, rank * 3 + 3)
        d_start = sum(DOC_SPLIT[:rank])
        d_rows = slice(d_start, d_start + DOC_SPLIT[rank])
        out = {"offset": rank_offset(DOC_SPLIT[rank])}
        for name in LOSS_NAMES:
            q = queries[q_rows].clone().requires_grad_(True)
            d = docs[d_rows].clone().requires_grad_(True)
            all_docs = gather_with_grad(d)
            local = get_loss(name)(4.0 * q @ all_docs.t(), positives[q_rows])
            # DDP averages gradients over ranks; dividing by WORLD here does the same for the check
            (local / WORLD).backward()
            total = local.detach().clone()
            dist.all_reduce(total)
            out[name] = (total / WORLD, q.grad, d.grad)
        t_rows = slice(rank * 5, rank * 5 + 5)
        out["sinkhorn"] = sinkhorn_knopp(teacher[t_rows], 0.5, 3)
        centre = DINOLoss(16)
        centre.teacher_probs(teacher[t_rows], 0.5, centering="softmax")
        out["center"] = centre.center.clone()
        torch.save(out, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.distributed
def test_two_process_gloo_equals_single_process():
    ref = full_batch_reference()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(free_port(), tmp), nprocs=WORLD, join=True)
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=True) for r in range(WORLD)]
    assert [r["offset"] for r in ranks] == [0, DOC_SPLIT[0]]
    for name in LOSS_NAMES:
        loss, q_grad, d_grad = ref[name]
        for rank, res in enumerate(ranks):
            assert torch.allclose(res[name][0], loss, atol=1e-12), name
            d_start = sum(DOC_SPLIT[:rank])
            assert torch.allclose(res[name][1], q_grad[rank * 3: rank * 3 + 3], atol=1e-12), name
            assert torch.allclose(res[name][2], d_grad[d_start: d_start + DOC_SPLIT[rank]],
                                  atol=1e-12), name
    sinkhorn = torch.cat([r["sinkhorn"] for r in ranks])
    assert torch.allclose(sinkhorn, ref["sinkhorn"], atol=1e-12)
    for res in ranks:
        assert torch.allclose(res["center"], ref["center"].to(res["center"].dtype), atol=1e-6)
