"""Training loop for dual-encoder retrievers: groups -> embeddings -> named loss -> AdamW.

Epoch plan: ``train.epochs`` with ``loss.name``, then ``curriculum.stage2_epochs`` with
``curriculum.stage2_loss`` (paper 000 §4.3: multi-positive stage, then SingleLH). With
``weakening.enabled`` the ambiguated positive sets (paper 004 §3) are recomputed at the start of
every epoch from the model's own scores over that epoch's candidates (the delayed update), and the
loss sees them in place of the annotated positives. The loop only steps, logs (tqdm, CSV,
TensorBoard, a PNG loss curve) and saves; the loss is built in ``objective.py``.
"""
from __future__ import annotations

import csv
import math
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from gsdistill.config import save_config, to_dict
from gsdistill.losses import get_loss, loss_kind
from gsdistill.losses.gather import is_distributed
from gsdistill.retriever.data import RetrievalData
from gsdistill.retriever.groups import GroupSampler, TrainGroup, batches
from gsdistill.retriever.model import DualEncoder
from gsdistill.retriever.objective import (
    autocast_for, grad_cache_backward, loss_from_embeddings, step_inputs,
)
from gsdistill.retriever.train_support import (  # noqa: F401  (re-exported: older imports)
    PassageCache, init_distributed, plot_losses, sync_gradients,
)

LOG_FIELDS = ["step", "epoch", "loss_name", "loss", "lr", "temperature", "anchors_used",
              "anchors_without_positive", "weak_extra_positives", "seconds"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_model(cfg: DictConfig) -> DualEncoder:
    m = cfg.model
    return DualEncoder(m.encoder, shared=m.shared, pooling=m.pooling, normalize=m.normalize,
                       temperature=m.temperature, learn_temperature=m.learn_temperature,
                       query_max_length=m.query_max_length, passage_max_length=m.passage_max_length,
                       freeze_passage=m.freeze_passage, train_top_layers=m.train_top_layers)


def build_loss(name: str, kwargs: dict, seed: int) -> torch.nn.Module:
    kwargs = dict(kwargs)
    if name == "rand1_lh":
        kwargs.setdefault("seed", seed)
    from gsdistill.retriever.st_mnrl import EXTRA_LOSSES
    return EXTRA_LOSSES[name](**kwargs) if name in EXTRA_LOSSES else get_loss(name, **kwargs)


class RetrieverTrainer:
    """``RetrieverTrainer(cfg, data, run_dir).fit() -> DualEncoder`` (trained, saved in run_dir/model)."""

    def __init__(self, cfg: DictConfig, data: RetrievalData, run_dir: str | Path,
                 qrels: dict[str, dict[str, int]] | None = None, model: DualEncoder | None = None,
                 passage_embeddings: torch.Tensor | None = None, progress: bool = True,
                 mined_negatives: dict[str, list[int]] | None = None, remine=None):
        self.cfg, self.data, self.run_dir, self.progress = cfg, data, Path(run_dir), progress
        if is_distributed():  # every rank logs; rank 0 in run_dir, the others beside it
            import torch.distributed as dist
            if dist.get_rank() > 0:
                self.run_dir, self.progress = self.run_dir / f"rank{dist.get_rank()}", False
        if cfg.train.amp not in ("auto", "bf16", "fp16", "off"):
            raise ValueError(f"train.amp must be auto, bf16, fp16 or off, got {cfg.train.amp!r}")
        if cfg.weakening.enabled and loss_kind(cfg.loss.name) == "graded":
            raise ValueError(f"weakening.enabled widens the positive set; graded loss {cfg.loss.name!r} "
                             "takes grades, not positives (use superset_pairwise or a multi-positive loss)")
        self.qrels = data.qrels if qrels is None else qrels  # noisy labels go here
        torch.manual_seed(cfg.train.seed)
        self.device = resolve_device(cfg.train.device)
        self.model = (model or build_model(cfg)).to(self.device)
        self.cache = None
        if self.model.freeze_passage:
            self.cache = PassageCache(self.model, data.doc_texts, cfg.eval.batch_size, passage_embeddings)
        train_view = RetrievalData(data.doc_ids, data.doc_texts, data.queries, self.qrels, data.negatives,
                                   data.skipped, data.source)
        self.sampler = GroupSampler(train_view, cfg.groups.size, cfg.groups.max_positives, cfg.train.seed,
                                    mined_negatives)
        self.remine = remine  # remine(model) -> fresh mined lists at each later epoch start
        self.autocast, self.scaler = autocast_for(self.device, cfg.train.amp)
        self.history: list[dict] = []

    @staticmethod
    def _world() -> int:
        if not is_distributed():
            return 1
        import torch.distributed as dist
        return dist.get_world_size()

    def _optimizer(self, total_steps: int):
        params = [p for p in self.model.parameters() if p.requires_grad]
        # float(): YAML reads "1e-4" (no dot) as a string
        lr, wd = float(self.cfg.train.lr), float(self.cfg.train.weight_decay)
        try:  # the fused kernel is several times faster than the per-tensor loop on CPU and GPU
            opt = torch.optim.AdamW(params, lr=lr, weight_decay=wd, fused=True)
        except (RuntimeError, TypeError):
            opt = torch.optim.AdamW(params, lr=lr, weight_decay=wd)
        warm = max(1, int(self.cfg.train.warmup_ratio * total_steps))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min((s + 1) / warm, max(0.0, (total_steps - s) / max(1, total_steps - warm))))
        return opt, sched

    def _passage_side(self, cand_idx: torch.Tensor):
        if self.cache is not None:
            return None, self.cache.get(cand_idx)
        return self.model.encode_passages, [self.data.doc_texts[i] for i in cand_idx.tolist()]

    def weak_positive_sets(self, groups: list[TrainGroup]) -> dict[str, set[int]]:
        """Paper 004 §3: candidates d of a query's list D_q (its group) with p(d|q) >= beta, as
        scored by the current model, join its positives for this epoch (delayed update)."""
        from gsdistill.losses import ambiguity_sets

        w, bs = self.cfg.weakening, self.cfg.eval.batch_size
        qids = [g.qid for g in groups]
        docs = torch.tensor([g.doc_idx for g in groups], dtype=torch.long)  # [Q, G]
        was_training = self.model.training
        with torch.no_grad():
            q = self.model.encode([self.data.queries[x] for x in qids], "query", bs)
            flat = docs.flatten()
            p = (self.cache.get(flat).cpu() if self.cache is not None else
                 self.model.encode([self.data.doc_texts[i] for i in flat.tolist()], "passage", bs))
            p = p.view(docs.shape[0], docs.shape[1], -1).to(self.device)
            scores = self.model.logit_scale(torch.einsum("qd,qgd->qg", q.to(self.device), p)).float()
        self.model.train(was_training)
        positives = torch.tensor([[self.qrels.get(x, {}).get(self.data.doc_ids[i], 0) > 0 for i in row]
                                  for x, row in zip(qids, docs.tolist())], dtype=torch.bool, device=scores.device)
        amb = (ambiguity_sets(scores, positives, w.beta, w.alpha) & ~positives).cpu()
        return {x: set(docs[r][amb[r]].tolist()) for r, x in enumerate(qids)}

    def _step(self, loss_fn, loss_name: str, groups: list[TrainGroup], weak) -> float:
        cfg = self.cfg
        inputs = step_inputs(groups, self.data)
        accum = max(1, cfg.train.accumulation)

        def loss_of(q_emb, p_emb):
            loss = loss_from_embeddings(loss_fn, loss_name, q_emb, p_emb, self.model.logit_scale, inputs,
                                        self.data, self.qrels, in_batch=cfg.loss.in_batch,
                                        cross_device=cfg.loss.cross_device, weak_positives=weak)
            return loss / accum

        scale = self.scaler.scale if self.scaler is not None else (lambda x: x)
        sides = [(self.model.encode_queries, inputs.query_texts), self._passage_side(inputs.cand_idx)]
        if cfg.train.grad_cache_chunk > 0:
            loss = grad_cache_backward(sides, cfg.train.grad_cache_chunk, loss_of, self.device, self.autocast, scale)
        else:
            with self.autocast:
                embs = [fn(x) if fn is not None else x for fn, x in sides]
            loss = loss_of(*[e.float() for e in embs])
            scale(loss).backward()
            loss = loss.detach()
        return float(loss) * accum

    def _apply(self, opt, sched) -> None:
        params = [p for p in self.model.parameters() if p.requires_grad]
        sync_gradients(params)
        if self.scaler is not None:
            self.scaler.unscale_(opt)
        if self.cfg.train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.cfg.train.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(opt)
            self.scaler.update()
        else:
            opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    def epoch_plan(self) -> list[str]:
        plan = [self.cfg.loss.name] * self.cfg.train.epochs
        if self.cfg.curriculum.stage2_epochs > 0:
            plan += [self.cfg.curriculum.stage2_loss] * self.cfg.curriculum.stage2_epochs
        return plan

    def fit(self) -> DualEncoder:
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        cfg, plan = self.cfg, self.epoch_plan()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir)
        accum = max(1, cfg.train.accumulation)
        world = self._world()
        per_epoch = math.ceil((len(self.sampler.qids) // world) / cfg.train.batch_size)
        opt, sched = self._optimizer(max(1, math.ceil(per_epoch / accum) * len(plan)))
        losses = {name: build_loss(name, cfg.loss.kwargs if name == cfg.loss.name else {}, cfg.train.seed)
                  for name in dict.fromkeys(plan)}
        writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        log = open(self.run_dir / "metrics.csv", "w", newline="")
        out = csv.DictWriter(log, fieldnames=LOG_FIELDS)
        out.writeheader()
        self.model.train()
        step = 0
        bar = tqdm(total=per_epoch * len(plan), desc="retriever train", disable=not self.progress)
        for epoch, loss_name in enumerate(plan):
            if self.remine is not None and epoch > 0:
                self.sampler.mined = self.remine(self.model)
            groups = self.sampler.epoch_groups(epoch)
            if world > 1:  # same shuffled order on every rank; each takes an equal share
                import torch.distributed as dist
                groups = groups[:len(groups) - len(groups) % world][dist.get_rank()::world]
            weak = self.weak_positive_sets(groups) if cfg.weakening.enabled else None
            n_weak = sum(len(v) for v in weak.values()) if weak else 0
            epoch_batches = batches(groups, cfg.train.batch_size)
            for i, batch in enumerate(epoch_batches):
                t0 = time.perf_counter()
                value = self._step(losses[loss_name], loss_name, batch, weak)
                if (i + 1) % accum == 0 or i == len(epoch_batches) - 1:
                    self._apply(opt, sched)
                stats = getattr(losses[loss_name], "last_stats", {}) or {}
                row = {"step": step, "epoch": epoch, "loss_name": loss_name, "loss": value,
                       "lr": sched.get_last_lr()[0], "temperature": self.model.logit_scale.temperature,
                       "anchors_used": stats.get("anchors_used", ""),
                       "anchors_without_positive": stats.get("anchors_without_positive", ""),
                       "weak_extra_positives": n_weak, "seconds": time.perf_counter() - t0}
                out.writerow(row)
                self.history.append(row)
                writer.add_scalar("train/loss", value, step)
                writer.add_scalar("train/lr", row["lr"], step)
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4f}", epoch=epoch)
        bar.close()
        log.close()
        writer.close()
        plot_losses(self.history, self.run_dir / "plots" / "loss.png")
        return self.model

    def save(self, metrics: dict | None = None) -> Path:
        card = {"data": f"{self.data.source} ({len(self.sampler.qids)} training queries)",
                "loss": " then ".join(dict.fromkeys(self.epoch_plan())) +
                        (" with label weakening" if self.cfg.weakening.enabled else ""),
                "training": to_dict(self.cfg.train), "metrics": metrics or {}}
        path = self.model.save_pretrained(self.run_dir / "model", card)
        save_config(self.cfg, path)
        return path
