"""The retriever's engine and step stream for the shared training loop (:mod:`gsdistill.pretrain.loop`),
and the frozen-passage cache.

``RetrieverEngine`` has the engine surface of the pretraining engines. Its ``forward`` runs the
step's micro-batches (gradient accumulation) forward *and* backward, because GradCache back-propagates
through cached embeddings inside the step; it returns the mean loss as ``"total"`` (detached) with the
loss's counters and the temperature, and ``backward_step`` averages gradients over ranks, clips and
steps AdamW. ``StepStream`` yields one optimiser step at a time along the epoch plan, with a JSON
position that holds what the epoch start computed from the model (re-mined negatives, label-weakening
sets), so a run resumed mid-epoch continues exactly as the uninterrupted one.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from gsdistill.pretrain import checkpoint
from gsdistill.pretrain.distributed import average_gradients, join_from_env, pick_device
from gsdistill.retriever.groups import batches
from gsdistill.retriever.model import DualEncoder
from gsdistill.retriever.objective import autocast_for, grad_cache_backward, loss_from_embeddings, step_inputs

sync_gradients = average_gradients  # older name


def local_device(name: str = "auto") -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK`` under a launcher, made the current CUDA device
    (else every rank's CUDA work, RNG state and NCCL calls land on GPU 0)."""
    import os
    return pick_device(name, int(os.environ.get("LOCAL_RANK", "0")))


def init_distributed(device_name: str = "auto") -> bool:
    """Set this rank's device, then join the process group a launcher (torchrun) describes in the
    environment (nccl on CUDA, gloo on the CPU); False when alone."""
    return join_from_env(local_device(device_name))


class PassageCache:
    """Embeddings of a frozen passage tower, computed once per document on first use."""

    def __init__(self, model: DualEncoder, texts: list[str], batch_size: int, embeddings: torch.Tensor | None = None):
        self.model, self.texts, self.batch_size = model, texts, batch_size
        dim = int(model.query_encoder.config.hidden_size)
        self.emb = embeddings.float().cpu() if embeddings is not None else torch.zeros(len(texts), dim)
        self.filled = torch.full((len(texts),), embeddings is not None)
        if embeddings is not None and embeddings.shape[0] != len(texts):
            raise ValueError(f"passage embeddings have {embeddings.shape[0]} rows, corpus has {len(texts)} docs")

    def get(self, idx: torch.Tensor) -> torch.Tensor:
        missing = idx[~self.filled[idx]].unique()
        if len(missing):
            self.emb[missing] = self.model.encode([self.texts[i] for i in missing.tolist()], "passage", self.batch_size)
            self.filled[missing] = True
        return self.emb[idx].to(self.model.device)


def _generators(losses: dict[str, torch.nn.Module]) -> dict[str, torch.Generator]:
    """The losses' own random generators (Rand1LH's positive draw), by ``loss.attribute``."""
    return {f"{name}.{attr}": value for name, loss in losses.items() for attr, value in vars(loss).items()
            if isinstance(value, torch.Generator)}


class RetrieverEngine:
    """AdamW on the trainable weights of a :class:`DualEncoder`; the loss named by each batch."""

    def __init__(self, trainer, losses: dict[str, torch.nn.Module]):
        self.trainer, self.module, self.losses = trainer, trainer.model, losses
        self.cfg, self.device = trainer.cfg, trainer.device
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        lr, wd = float(self.cfg.train.lr), float(self.cfg.train.weight_decay)  # YAML reads "1e-4" as a string
        try:  # the fused kernel is several times faster than the per-tensor loop on CPU and GPU
            self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=wd, fused=True)
        except (RuntimeError, TypeError):
            self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=wd)
        self.autocast, self.scaler = autocast_for(self.device, self.cfg.train.amp)

    def _micro_step(self, loss_fn, loss_name: str, groups, weak, n_micro: int) -> torch.Tensor:
        cfg, model, trainer = self.cfg, self.module, self.trainer
        inputs = step_inputs(groups, trainer.data)

        def loss_of(q_emb, p_emb):
            return loss_from_embeddings(loss_fn, loss_name, q_emb, p_emb, model.logit_scale, inputs, trainer.data,
                                        trainer.qrels, in_batch=cfg.loss.in_batch, cross_device=cfg.loss.cross_device,
                                        weak_positives=weak) / n_micro

        scale = self.scaler.scale if self.scaler is not None else (lambda x: x)
        if trainer.cache is not None:
            passages = (None, trainer.cache.get(inputs.cand_idx))
        else:
            passages = (model.encode_passages, [trainer.data.doc_texts[i] for i in inputs.cand_idx.tolist()])
        sides = [(model.encode_queries, inputs.query_texts), passages]
        if cfg.train.grad_cache_chunk > 0:
            return grad_cache_backward(sides, cfg.train.grad_cache_chunk, loss_of, self.device, self.autocast, scale)
        with self.autocast:
            embs = [fn(x) if fn is not None else x for fn, x in sides]
        loss = loss_of(*[e.float() for e in embs])
        scale(loss).backward()
        return loss.detach()

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """Forward and backward of the step's micro-batches; ``{"total": mean loss, counters, temperature}``."""
        self.module.train()
        loss_fn, micro = self.losses[batch["loss_name"]], batch["micro"]
        total = sum(self._micro_step(loss_fn, batch["loss_name"], groups, batch["weak"], len(micro))
                    for groups in micro)
        terms = {"total": total}
        stats = getattr(loss_fn, "last_stats", None) or {}
        terms.update({k: stats[k] for k in ("anchors_used", "anchors_without_positive") if k in stats})
        terms["temperature"] = 1.0 / self.module.logit_scale.scale.detach()  # a tensor: fetched with the loss
        return terms

    def backward_step(self, total: torch.Tensor, lr: float) -> torch.Tensor:
        """Average gradients over ranks, clip, AdamW at ``lr``; the pre-clip grad norm (a tensor: no sync)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        average_gradients(self.params)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = float(self.cfg.train.max_grad_norm)
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm if max_norm > 0 else math.inf)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach()

    @torch.no_grad()
    def weight_norm(self) -> torch.Tensor:
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.float()) for p in self.params]))

    def model_state(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def save(self, folder: Path, rank: int) -> None:
        """Rank 0: weights, optimizer (+ fp16 loss scaler, loss generators); identical on every rank."""
        if rank == 0:
            checkpoint.write_model(folder, self.model_state())
            extra = {"optimizer": self.optimizer.state_dict(),
                     "generators": {k: g.get_state() for k, g in _generators(self.losses).items()}}
            if self.scaler is not None:
                extra["scaler"] = self.scaler.state_dict()
            checkpoint.save_torch(extra, Path(folder) / checkpoint.OPTIM_FILE)

    def load(self, folder: Path) -> None:
        checkpoint.load_model_state(self.module, checkpoint.read_model(folder, self.device),
                                    Path(folder) / checkpoint.MODEL_FILE)
        extra = checkpoint.read_optimizer(folder)
        self.optimizer.load_state_dict(extra["optimizer"])
        for key, gen in _generators(self.losses).items():
            gen.set_state(extra["generators"][key])
        if self.scaler is not None and "scaler" in extra:
            self.scaler.load_state_dict(extra["scaler"])


class StepStream:
    """Optimiser steps along the epoch plan: ``{"micro": [groups of each micro-batch], "loss_name",
    "weak", "log"}``. Position ``{"epoch", "batch", "start"}``: ``start`` is what the epoch's start
    computed from the model (``mined`` when re-mining, ``weak`` with label weakening)."""

    def __init__(self, trainer, plan: list[str], rank: int = 0, world: int = 1):
        self.t, self.plan, self.rank, self.world = trainer, plan, rank, world
        self.batch_size, self.accum = int(trainer.cfg.train.batch_size), max(1, int(trainer.cfg.train.accumulation))
        micro = math.ceil((len(trainer.sampler.qids) // world) / self.batch_size)
        self.steps_per_epoch = math.ceil(micro / self.accum)
        self.position: dict = {"epoch": 0, "batch": 0}
        self._epoch: tuple | None = None  # (epoch, micro-batches, weak sets)
        self._start: dict = {}
        self._pending: dict | None = None

    @property
    def steps(self) -> int:
        return self.steps_per_epoch * len(self.plan)

    def restore(self, position: dict) -> None:
        self.position = {"epoch": int(position["epoch"]), "batch": int(position["batch"])}
        self._epoch, self._pending = None, position.get("start")

    def _start_epoch(self, epoch: int, saved: dict | None) -> None:
        t, saved = self.t, saved or {}
        if "mined" in saved:
            t.sampler.mined = {q: list(v) for q, v in saved["mined"].items()}
        elif t.remine is not None and epoch > 0:
            t.sampler.mined = t.remine(t.model)
        groups = t.sampler.epoch_groups(epoch)
        if self.world > 1:  # same shuffled order on every rank; each takes an equal share
            groups = groups[:len(groups) - len(groups) % self.world][self.rank::self.world]
        if "weak" in saved:
            weak = {q: set(v) for q, v in saved["weak"].items()}
        else:
            weak = t.weak_positive_sets(groups) if t.cfg.weakening.enabled else None
        self._epoch = (epoch, batches(groups, self.batch_size), weak)
        self._start = {"epoch": epoch}
        if t.remine is not None and epoch > 0:
            self._start["mined"] = t.sampler.mined
        if weak is not None:
            self._start["weak"] = {q: sorted(v) for q, v in weak.items()}

    def __next__(self) -> dict:
        epoch, k = self.position["epoch"], self.position["batch"]
        if k >= self.steps_per_epoch:
            if self.t.on_epoch_end is not None:  # e.g. dev selection, before the next epoch's first step
                self.t.on_epoch_end(epoch, self.t.model)
            epoch, k = epoch + 1, 0
        if epoch >= len(self.plan):
            raise StopIteration
        if self._epoch is None or self._epoch[0] != epoch:
            pending, self._pending = self._pending, None
            self._start_epoch(epoch, pending if pending and pending.get("epoch") == epoch else None)
        _, micro, weak = self._epoch
        self.position = {"epoch": epoch, "batch": k + 1, "start": self._start}
        n_weak = sum(len(v) for v in weak.values()) if weak else 0
        return {"micro": micro[k * self.accum:(k + 1) * self.accum], "loss_name": self.plan[epoch], "weak": weak,
                "log": {"epoch": epoch, "loss_name": self.plan[epoch], "weak_extra_positives": n_weak}}

    def __iter__(self):
        return self
