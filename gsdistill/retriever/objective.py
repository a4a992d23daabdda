"""One training step's loss: queries x candidate passages -> logits -> the named loss of the core.

Candidates are the passages of every group in the batch (in-batch negatives), all-gathered over
devices (``gather_with_grad``) when ``cross_device``; with ``in_batch=False`` each query only sees
its own group. The loss is called by its kind (``gsdistill.losses.loss_kind``, the registry's one
name normalisation): multi_positive / noisy -> ``loss(logits, positives, valid)``, graded ->
``loss(logits, grades, valid)``; ELS also gets ``doc_sim`` (cosines between the candidates), and
``st_mnrl`` (sentence-transformers' MNRL) takes the embeddings themselves.
Label weakening passes the ambiguated positive set instead of the annotated one.

``grad_cache_backward`` is GradCache (Gao et al. 2021): embeddings are computed without a graph in
chunks, the loss is back-propagated to the embeddings only, then each chunk is re-encoded with a
graph and its cached embedding gradient pushed through. The RNG state of each chunk is replayed, so
the parameter gradients equal those of one full-batch backward (tested), at the memory of one chunk.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from gsdistill.losses import gather_with_grad, loss_kind
from gsdistill.retriever.data import RetrievalData
from gsdistill.retriever.groups import TrainGroup, candidate_labels


@dataclass
class StepInputs:
    qids: list[str]
    query_texts: list[str]
    cand_idx: torch.Tensor  # long[N_local] corpus indices, group after group
    group_of: torch.Tensor  # long[N_local] which local query's group each candidate came from


def step_inputs(groups: list[TrainGroup], data: RetrievalData) -> StepInputs:
    idx = [i for g in groups for i in g.doc_idx]
    owner = [row for row, g in enumerate(groups) for _ in g.doc_idx]
    return StepInputs([g.qid for g in groups], [data.queries[g.qid] for g in groups],
                      torch.tensor(idx, dtype=torch.long), torch.tensor(owner, dtype=torch.long))


def loss_from_embeddings(loss_fn, loss_name: str, q_emb: torch.Tensor, p_emb: torch.Tensor, scale,
                         inputs: StepInputs, data: RetrievalData, qrels: dict, *, in_batch: bool = True,
                         cross_device: bool = True, weak_positives: dict[str, set[int]] | None = None
                         ) -> torch.Tensor:
    """Scalar loss of local queries ``q_emb [B, D]`` against candidates ``p_emb [N_local, D]``."""
    if loss_name == "st_mnrl":
        return loss_fn(q_emb, p_emb)
    if not in_batch and loss_kind(loss_name) == "graded" and weak_positives is None:
        return own_context_loss(loss_fn, q_emb, p_emb, scale, inputs, data, qrels)
    cand_idx = inputs.cand_idx.to(p_emb.device)
    if cross_device and in_batch:
        p_emb = gather_with_grad(p_emb)
        cand_idx = gather_with_grad(cand_idx)  # integer rows: gathered, no gradient
    logits = scale(q_emb @ p_emb.T)
    visible = None
    if not in_batch:  # each query against its own group only
        visible = inputs.group_of.unsqueeze(0) == torch.arange(len(inputs.qids)).unsqueeze(1)
    grades, valid = candidate_labels(inputs.qids, cand_idx.cpu(), data, qrels, visible)
    positives = grades > 0  # relevant = any grade > 0 (float grades kept for graded losses)
    if weak_positives is not None:
        cols = cand_idx.cpu().tolist()
        extra = torch.tensor([[c in weak_positives.get(q, ()) for c in cols] for q in inputs.qids],
                             dtype=torch.bool).reshape(positives.shape)
        positives = positives | extra
    dev = logits.device
    if loss_kind(loss_name) == "graded":
        return loss_fn(logits.float(), grades.to(dev), valid.to(dev))
    if getattr(loss_fn, "needs_doc_similarity", False):
        return loss_fn(logits.float(), positives.to(dev), valid.to(dev), doc_sim=(p_emb @ p_emb.T).detach().float())
    return loss_fn(logits.float(), positives.to(dev), valid.to(dev))


def own_context_loss(loss_fn, q_emb: torch.Tensor, p_emb: torch.Tensor, scale, inputs: StepInputs,
                     data: RetrievalData, qrels: dict) -> torch.Tensor:
    """Graded loss over each query's own ranking context (paper 002 §A: ``H [b, |D_q|]``, row b =
    query b against its own group): logits and grades ``[B, G]``, each row's columns ordered by
    grade (highest first), so that column j means "the j-th most relevant passage of the query's
    context" in every row. For a row-wise loss this equals the masked ``[B, N]`` form; for the
    batch Gaussian Wasserstein loss it is the form that keeps rows comparable: that loss compares
    the rows as a distribution (invariant to permuting them), so over shared in-batch columns a
    query can take another query's target."""
    n_groups = len(inputs.qids)
    sizes = torch.bincount(inputs.group_of, minlength=n_groups)
    if not bool((sizes == sizes[0]).all()):
        raise ValueError(f"own ranking contexts need equal group sizes, got {sizes.tolist()}")
    cand = inputs.cand_idx.view(n_groups, -1)  # groups are contiguous, group after group
    grades = torch.tensor([[float(qrels.get(q, {}).get(data.doc_ids[i], 0)) for i in row]
                           for q, row in zip(inputs.qids, cand.tolist())]).clamp_min(0)
    order = torch.argsort(grades, dim=1, descending=True, stable=True)
    grades = grades.gather(1, order)
    dim = p_emb.shape[-1]
    rows = p_emb.view(n_groups, -1, dim).gather(1, order.to(p_emb.device).unsqueeze(-1).expand(-1, -1, dim))
    logits = scale(torch.einsum("bd,bgd->bg", q_emb, rows))
    valid = torch.ones(grades.shape, dtype=torch.bool, device=logits.device)
    return loss_fn(logits.float(), grades.to(logits.device), valid)


def autocast_for(device: torch.device, amp: str):
    """Mixed precision context: bf16/fp16 autocast on CUDA; CPU runs in fp32 (bf16 is slower here)."""
    if device.type != "cuda" or amp == "off":
        return nullcontext(), None
    dtype = torch.float16 if amp == "fp16" or (amp == "auto" and not torch.cuda.is_bf16_supported()) else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
    return torch.autocast("cuda", dtype=dtype), scaler


def _rng_state(device: torch.device):
    return (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def grad_cache_backward(sides: list[tuple[Callable | None, list[str] | torch.Tensor]], chunk: int,
                        loss_of: Callable[..., torch.Tensor], device: torch.device,
                        autocast=nullcontext(), scale_loss=lambda x: x) -> torch.Tensor:
    """GradCache over several encoders' inputs; returns the (detached) loss.

    ``sides``: ``(encode_fn, texts)`` per side (``encode_fn(list[str]) -> [n, D]`` with a graph), or
    ``(None, tensor)`` for fixed embeddings (e.g. cached passages). ``loss_of(*embeddings)`` builds
    the loss from one embedding tensor per side.
    """
    reps, plans = [], []
    for encode_fn, items in sides:
        if encode_fn is None:
            reps.append(items)
            plans.append(None)
            continue
        states, parts = [], []
        with torch.no_grad():
            for s in range(0, len(items), chunk):
                states.append(_rng_state(device))
                with autocast:
                    parts.append(encode_fn(items[s:s + chunk]).float())
        reps.append(torch.cat(parts).detach().requires_grad_(True))
        plans.append((encode_fn, items, states, [p.shape[0] for p in parts]))
    loss = loss_of(*reps)
    scale_loss(loss).backward()
    for rep, plan in zip(reps, plans):
        if plan is None:
            continue
        encode_fn, items, states, sizes = plan
        for s, state, grad in zip(range(0, len(items), chunk), states, rep.grad.split(sizes)):
            _set_rng_state(state, device)  # same dropout masks as in the no-graph pass
            with autocast:
                out = encode_fn(items[s:s + chunk]).float()
            out.backward(grad)
    return loss.detach()
