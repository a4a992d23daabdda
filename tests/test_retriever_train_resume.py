"""Retriever training on the shared loop: a run stopped and resumed equals the uninterrupted run bit
for bit (weights, logged losses), with dropout, a curriculum whose second loss draws random
positives, label-weakening sets computed at an epoch start, and a frozen passage tower whose cached
embeddings are recomputed on resume (with GradCache); two gloo processes with half the
batch each equal one process holding the whole batch."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from gsdistill.pretrain import checkpoint
from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.train import RetrieverTrainer
from gsdistill.run_log import read_rows
from retriever_fixtures import retriever_cfg, tiny_beir, tiny_encoder  # noqa: F401  (fixtures)

TIMING = ("data_s", "step_s")


def _train(beir, encoder, run_dir, *extra) -> RetrieverTrainer:
    cfg = retriever_cfg(beir, run_dir.parent, f"model.encoder={encoder}", "train.batch_size=2", "train.lr=1e-3",
                        "train.epochs=1", "curriculum.stage2_epochs=1", *extra)
    trainer = RetrieverTrainer(cfg, load_beir(beir), run_dir, progress=False)
    trainer.fit()
    return trainer


@pytest.mark.parametrize("extra", [["curriculum.stage2_loss=rand1_lh"],
                                   ["loss.name=superset_pairwise", "weakening.enabled=true", "weakening.beta=0.13"],
                                   ["model.shared=false", "model.freeze_passage=true", "train.grad_cache_chunk=3"]])
def test_resumed_run_equals_uninterrupted_run_bit_for_bit(tiny_beir, tiny_encoder, tmp_path, extra):
    full = _train(tiny_beir, tiny_encoder, tmp_path / "full", *extra)
    part = _train(tiny_beir, tiny_encoder, tmp_path / "part", *extra, "train.stop_after=4")  # mid second epoch
    state = checkpoint.read_state(checkpoint.resolve_checkpoint(tmp_path / "part"))
    assert state["step"] == 4 and state["data_position"]["epoch"] == 1 and len(part.history) == 4
    resumed = _train(tiny_beir, tiny_encoder, tmp_path / "part", *extra, f"train.resume={tmp_path / 'part'}")
    assert [r["step"] for r in resumed.history] == [5, 6]
    for a, b in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert a[0] == b[0] and torch.equal(a[1], b[1]), a[0]
    rows_full, rows_resumed = read_rows(tmp_path / "full" / "metrics.csv"), read_rows(tmp_path / "part" / "metrics.csv")
    assert len(rows_full) == len(rows_resumed) == 6
    for a, b in zip(rows_full, rows_resumed):
        assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}
    assert [r["loss_name"] for r in rows_full] == [extra[0].split("=")[1] if "loss.name" in extra[0] else
                                                   "sum_marg_lh"] * 3 + [full.cfg.curriculum.stage2_loss] * 3
    assert len({r["total"] for r in rows_full}) == 6  # the losses move: the comparison is not vacuous
    if "weakening.enabled=true" in extra:
        assert any(int(r["weak_extra_positives"]) > 0 for r in rows_full[3:])


def _no_dropout_copy(encoder: str, out) -> str:
    from transformers import AutoTokenizer, BertModel

    model = BertModel.from_pretrained(encoder, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(encoder).save_pretrained(out)
    return str(out)


def _worker(rank: int, world: int, port: int, beir: str, encoder: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        trainer = _train(beir, encoder, Path(out) / "ddp", "train.batch_size=2")
        if rank == 0:
            torch.save({"state": trainer.model.state_dict(), "history": trainer.history}, f"{out}/ddp.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.distributed
def test_two_processes_equal_one_process_on_the_same_global_batch(tiny_beir, tiny_encoder, tmp_path):
    encoder = _no_dropout_copy(tiny_encoder, tmp_path / "enc")  # dropout masks differ between layouts
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, str(tiny_beir), encoder, str(tmp_path)), nprocs=2, join=True)
    # 6 queries: rank r takes groups r, r+2, r+4 of the epoch, 2 per step -> global steps {0..3}, {4, 5}
    ref = _train(tiny_beir, encoder, tmp_path / "one", "train.batch_size=4")
    got = torch.load(tmp_path / "ddp.pt", weights_only=False)
    assert [r["step"] for r in got["history"]] == [r["step"] for r in ref.history] == [1, 2, 3, 4]
    for a, b in zip(ref.history, got["history"]):
        for key in ("total", "grad_norm", "lr", "weight_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
    # the gathered candidates come in another order, so sums round differently; Adam divides each
    # gradient by its own running scale, which turns a rounding difference on a near-zero gradient
    # into up to ~1% of lr (1e-3) after 4 steps: hence atol 1e-5 on the weights
    for name, value in ref.model.state_dict().items():
        torch.testing.assert_close(got["state"][name], value, rtol=1e-4, atol=1e-5, msg=name)
    from transformers import BertModel
    start = BertModel.from_pretrained(encoder).state_dict()
    assert max(float((ref.model.query_encoder.state_dict()[n] - v).abs().max()) for n, v in start.items()) > 1e-3
