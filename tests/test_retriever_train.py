"""Dual-encoder training: real MiniLM run lowers the loss; GradCache = plain gradients; label
weakening; graded losses; curriculum; frozen passage tower; save/load round trip."""
from __future__ import annotations

import csv

import pytest
import torch

from gsdistill.losses import get_loss
from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.groups import GroupSampler
from gsdistill.retriever.model import DualEncoder
from gsdistill.retriever.objective import grad_cache_backward, loss_from_embeddings, step_inputs
from gsdistill.retriever.train import RetrieverTrainer, build_model
from retriever_fixtures import retriever_cfg, tiny_beir, tiny_encoder  # noqa: F401  (fixtures)


def batch_loss(trainer: RetrieverTrainer, loss_name: str = "sum_marg_lh") -> float:
    """Loss of all queries against their epoch-0 groups, eval mode (no dropout): comparable over time."""
    inputs = step_inputs(trainer.sampler.epoch_groups(0), trainer.data)
    trainer.model.eval()
    with torch.no_grad():
        q = trainer.model.encode_queries(inputs.query_texts)
        p = trainer.model.encode_passages([trainer.data.doc_texts[i] for i in inputs.cand_idx.tolist()])
        loss = loss_from_embeddings(get_loss(loss_name), loss_name, q, p, trainer.model.logit_scale, inputs,
                                    trainer.data, trainer.qrels)
    return float(loss)


def test_real_minilm_training_lowers_the_loss(tiny_beir, tmp_path):
    # query-side fine-tuning of the real MiniLM (frozen, cached passage tower) keeps this test short
    cfg = retriever_cfg(tiny_beir, tmp_path, "train.epochs=3", "train.lr=1e-4", "train.warmup_ratio=0",
                        "model.shared=false", "model.freeze_passage=true")
    data = load_beir(tiny_beir)
    trainer = RetrieverTrainer(cfg, data, tmp_path / "run", progress=False)
    before = batch_loss(trainer)
    trainer.fit()
    after = batch_loss(trainer)
    assert after < 0.8 * before, (before, after)
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert len(rows) == 6 and {r["loss_name"] for r in rows} == {"sum_marg_lh"}
    assert (tmp_path / "run" / "plots" / "loss_terms.png").stat().st_size > 1000
    assert (tmp_path / "run" / "config.yaml").is_file() and any((tmp_path / "run" / "tb").iterdir())
    assert not (tmp_path / "run" / "checkpoints").exists()  # train.ckpt_every=0: no checkpoint unless stopped


def test_grad_cache_equals_full_batch_gradients(tiny_beir, tiny_encoder):
    data = load_beir(tiny_beir)
    model = DualEncoder(tiny_encoder, shared=False, query_max_length=16, passage_max_length=32)
    model.train()  # dropout on: GradCache must replay the same masks
    cfg = retriever_cfg(tiny_beir, "/tmp")
    groups = RetrieverTrainer(cfg, data, "/tmp/unused", model=model, progress=False).sampler.epoch_groups(0)
    inputs = step_inputs(groups, data)
    texts = [data.doc_texts[i] for i in inputs.cand_idx.tolist()]
    loss_fn = get_loss("joint_lh")

    def loss_of(q, p):
        return loss_from_embeddings(loss_fn, "joint_lh", q, p, model.logit_scale, inputs, data, data.qrels)

    def grads():
        out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return out

    def chunked(fn, items):  # full graph, encoded chunk by chunk: the RNG sequence GradCache replays
        return torch.cat([fn(items[i:i + 4]) for i in range(0, len(items), 4)])

    torch.manual_seed(5)
    full = loss_of(chunked(model.encode_queries, inputs.query_texts), chunked(model.encode_passages, texts))
    full.backward()
    g_full = grads()
    torch.manual_seed(5)
    cached = grad_cache_backward([(model.encode_queries, inputs.query_texts), (model.encode_passages, texts)],
                                 chunk=4, loss_of=loss_of, device=torch.device("cpu"))
    g_cached = grads()
    assert torch.allclose(full.detach(), cached, atol=1e-6)
    assert g_full.keys() == g_cached.keys() and len(g_full) > 10
    for name in g_full:
        assert torch.allclose(g_full[name], g_cached[name], atol=1e-5, rtol=1e-4), name
    # without dropout GradCache also equals one un-chunked full-batch backward
    model.eval()
    loss_of(model.encode_queries(inputs.query_texts), model.encode_passages(texts)).backward()
    g_plain = grads()
    grad_cache_backward([(model.encode_queries, inputs.query_texts), (model.encode_passages, texts)],
                        chunk=5, loss_of=loss_of, device=torch.device("cpu"))
    g_cached = grads()
    for name in g_plain:
        assert torch.allclose(g_plain[name], g_cached[name], atol=1e-5, rtol=1e-4), name


def test_in_batch_off_restricts_each_query_to_its_group(tiny_beir):
    from gsdistill.retriever.groups import TrainGroup

    data = load_beir(tiny_beir)
    ix = data.doc_index
    docs = {"q-cat": ["cat-0", "cat-1", "filler-0", "paris-0"], "q-paris": ["paris-0", "paris-1", "filler-0", "filler-1"],
            "q-python": ["python-0", "python-1", "filler-0", "volcano-0"]}
    groups = [TrainGroup(q, [ix[d] for d in ds], [data.qrels[q].get(d, 0) for d in ds]) for q, ds in docs.items()]
    inputs = step_inputs(groups, data)
    g = torch.Generator().manual_seed(0)
    q, p = torch.randn(3, 8, generator=g), torch.randn(12, 8, generator=g)
    got = loss_from_embeddings(get_loss("single_lh"), "single_lh", q, p, lambda x: x, inputs, data, data.qrels,
                               in_batch=False)
    # reference: each query's first positive against its own negatives (filler-0 repeated across
    # groups stays valid in each; the other positive leaves the denominator, paper 000 eq. 3)
    ref = torch.stack([torch.logsumexp(q[i] @ p[[4 * i, 4 * i + 2, 4 * i + 3]].mT, 0) - q[i] @ p[4 * i]
                       for i in range(3)]).mean()
    assert torch.allclose(got, ref, atol=1e-5)
    in_batch = loss_from_embeddings(get_loss("single_lh"), "single_lh", q, p, lambda x: x, inputs, data,
                                    data.qrels, in_batch=True)
    assert in_batch > got  # more negatives (paris-0 is a positive of q-paris only)


def test_graded_loss_gets_grades_and_trains(tiny_beir, tiny_encoder, tmp_path):
    data = load_beir(tiny_beir)
    cfg = retriever_cfg(tiny_beir, tmp_path, f"model.encoder={tiny_encoder}", "loss.name=wasserstein",
                        "loss.in_batch=false", "train.epochs=2", "curriculum.stage2_epochs=1")
    trainer = RetrieverTrainer(cfg, data, tmp_path / "run", progress=False)
    groups = trainer.sampler.epoch_groups(0)[:2]
    inputs = step_inputs(groups, data)
    q, p = torch.randn(2, 32), torch.randn(16, 32)
    got = loss_from_embeddings(get_loss("wasserstein"), "wasserstein", q, p, lambda x: x, inputs, data, data.qrels,
                               in_batch=False)
    # reference: row b = query b against its own 8 passages, columns ordered by grade (paper 002 §A)
    grades = torch.tensor([g.grades for g in groups], dtype=torch.float32)
    order = torch.argsort(grades, dim=1, descending=True, stable=True)
    logits = torch.stack([q[b] @ p[8 * b + order[b]].T for b in range(2)])
    assert grades.max() == 2
    assert torch.allclose(got, get_loss("wasserstein")(logits, grades.gather(1, order)), atol=1e-6)
    trainer.fit()
    names = [r["loss_name"] for r in trainer.history]
    assert names == ["wasserstein"] * 4 + ["single_lh"] * 2  # two-stage curriculum
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in trainer.history)


def test_own_context_equals_the_masked_form_for_row_wise_graded_losses(tiny_beir):
    data = load_beir(tiny_beir)
    inputs = step_inputs(GroupSampler(data, group_size=4, max_positives=2, seed=1).epoch_groups(0)[:3], data)
    g = torch.Generator().manual_seed(1)
    q, p = torch.randn(3, 8, generator=g), torch.randn(12, 8, generator=g)
    from gsdistill.retriever.groups import candidate_labels
    visible = inputs.group_of.unsqueeze(0) == torch.arange(3).unsqueeze(1)
    grades, valid = candidate_labels(inputs.qids, inputs.cand_idx, data, visible=visible)
    for name in ("listnet", "kl"):
        own = loss_from_embeddings(get_loss(name), name, q, p, lambda x: x, inputs, data, data.qrels, in_batch=False)
        assert torch.allclose(own, get_loss(name)(q @ p.T, grades, valid), atol=1e-6), name


def test_batch_wasserstein_cannot_tell_rows_apart_so_in_batch_columns_warn(tiny_beir, tiny_encoder):
    g = torch.Generator().manual_seed(0)
    scores, grades = torch.randn(4, 12, generator=g), torch.zeros(4, 12)
    grades[torch.arange(4), torch.tensor([0, 3, 6, 9])] = 2.0  # query b's positive in column 3b
    swapped = scores[[1, 0, 3, 2]]  # every query scored like another one
    w = get_loss("wasserstein")
    assert torch.allclose(w(swapped, grades), w(scores, grades), atol=1e-6)  # same loss: rows are a set
    with pytest.warns(UserWarning, match="loss.in_batch=false"):
        RetrieverTrainer(retriever_cfg(tiny_beir, "/tmp", f"model.encoder={tiny_encoder}", "loss.name=Wasserstein"),
                         load_beir(tiny_beir), "/tmp/x")


def test_build_model_rejects_bad_settings(tiny_beir, tiny_encoder):
    with pytest.raises(ValueError, match="freeze_passage needs separate towers"):
        build_model(retriever_cfg(tiny_beir, "/tmp", f"model.encoder={tiny_encoder}", "model.freeze_passage=true"))
    data = load_beir(tiny_beir)
    with pytest.raises(ValueError, match="train.amp"):
        RetrieverTrainer(retriever_cfg(tiny_beir, "/tmp", f"model.encoder={tiny_encoder}", "train.amp=fp8"), data, "/tmp/x")
    with pytest.raises(ValueError, match="graded loss 'wasserstein'"):
        RetrieverTrainer(retriever_cfg(tiny_beir, "/tmp", f"model.encoder={tiny_encoder}", "loss.name=wasserstein",
                                       "loss.in_batch=false", "weakening.enabled=true"), data, "/tmp/x")
    with pytest.raises(ValueError, match="pooling"):
        build_model(retriever_cfg(tiny_beir, "/tmp", f"model.encoder={tiny_encoder}", "model.pooling=max"))


def test_gradient_accumulation_steps_every_k_micro_batches(tiny_beir, tiny_encoder, tmp_path, monkeypatch):
    data = load_beir(tiny_beir)
    cfg = retriever_cfg(tiny_beir, tmp_path, f"model.encoder={tiny_encoder}", "train.batch_size=2",
                        "train.accumulation=2", "train.epochs=2")
    trainer = RetrieverTrainer(cfg, data, tmp_path / "run", progress=False)
    micro, updates = [], []
    real_forward = trainer.engine.forward
    monkeypatch.setattr(trainer.engine, "forward",
                        lambda batch: (micro.append(len(batch["micro"])), real_forward(batch))[1])
    trainer.engine.optimizer.register_step_post_hook(lambda *_: updates.append(len(micro)))
    trainer.fit()
    # 6 queries / 2 = 3 micro-batches per epoch: one update after micro-batches 1-2, one after the epoch's last
    assert micro == [2, 1, 2, 1] and updates == [1, 2, 3, 4] and len(trainer.history) == 4
    assert [r["epoch"] for r in trainer.history] == [0, 0, 1, 1]
