"""Cross-device negatives: two gloo processes, each with half the batch, gathered candidates and
averaged gradients, give the gradients of one process holding the whole batch."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gsdistill.losses import get_loss
from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.groups import GroupSampler
from gsdistill.retriever.model import DualEncoder
from gsdistill.retriever.objective import loss_from_embeddings, step_inputs
from gsdistill.retriever.train import sync_gradients
from retriever_fixtures import tiny_beir, tiny_encoder  # noqa: F401  (fixtures)


def batch_grads(model, groups, data) -> dict[str, torch.Tensor]:
    inputs = step_inputs(groups, data)
    q = model.encode_queries(inputs.query_texts)
    p = model.encode_passages([data.doc_texts[i] for i in inputs.cand_idx.tolist()])
    loss = loss_from_embeddings(get_loss("sum_marg_lh"), "sum_marg_lh", q, p, model.logit_scale, inputs, data,
                                data.qrels)
    loss.backward()
    sync_gradients([p for p in model.parameters() if p.requires_grad])
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def worker(rank: int, world: int, port: int, beir: str, encoder: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        data = load_beir(beir)
        groups = GroupSampler(data, 4, 2, seed=0).epoch_groups(0)
        model = DualEncoder(encoder, query_max_length=16, passage_max_length=32).eval()
        half = len(groups) // world
        torch.save(batch_grads(model, groups[rank * half:(rank + 1) * half], data), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes: ~40 s on 2 shared cores
@pytest.mark.distributed
def test_two_process_gradients_equal_single_process(tiny_beir, tiny_encoder, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(2, port, str(tiny_beir), tiny_encoder, str(tmp_path)), nprocs=2, join=True)
    data = load_beir(tiny_beir)
    groups = GroupSampler(data, 4, 2, seed=0).epoch_groups(0)
    model = DualEncoder(tiny_encoder, query_max_length=16, passage_max_length=32).eval()
    # one process, all 6 queries against all 24 passages, mean over the 6 anchors; each rank's loss is
    # the mean over its 3 anchors, and averaging the ranks' gradients gives the same mean
    ref = batch_grads(model, groups, data)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert set(ref) <= set(got)  # sync_gradients zero-fills unused parameters (the BERT pooler)
        assert all(not got[n].any() for n in set(got) - set(ref))
        for name in ref:
            assert torch.allclose(got[name], ref[name], atol=1e-6, rtol=1e-4), (rank, name)
