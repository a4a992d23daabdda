"""Dual-encoder retriever training on the shared loop: groups -> embeddings -> named loss -> AdamW.

Epoch plan: ``train.epochs`` with ``loss.name``, then ``curriculum.stage2_epochs`` with
``curriculum.stage2_loss`` (paper 000 §4.3: multi-positive stage, then SingleLH). With
``weakening.enabled`` the ambiguated positive sets (paper 004 §3) are recomputed at the start of
every epoch from the model's own scores over that epoch's candidates (the delayed update), and the
loss sees them in place of the annotated positives.

Stepping, logging (``metrics.csv``, TensorBoard under ``tb/``, ``plots/``), checkpoints, resume
(``train.resume``, ``train.stop_after``), divergence stops and the learning-rate schedule (linear
warm-up over ``train.warmup_ratio`` of the steps, then linear decay) are the pretraining loop's
(:mod:`gsdistill.pretrain.loop`); the engine and the step stream are in ``train_support.py``, the
loss of a step in ``objective.py``; what a resume may change, and the run's ``history.jsonl`` of
starts and resumes, in ``resume.py``. ``train.batch_size`` is per process: under ``torchrun`` each
rank takes an equal share of every epoch's groups and the candidates are gathered over ranks.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig

from gsdistill.config import save_config, to_dict
from gsdistill.losses import get_loss, loss_key, loss_kind
from gsdistill.device import resolve_device
from gsdistill.pretrain.distributed import rank_and_world
from gsdistill.pretrain.loop import LoopPlan, Trainer
from gsdistill.pretrain.schedules import linear_with_warmup
from gsdistill.retriever import resume as resuming
from gsdistill.retriever.data import RetrievalData
from gsdistill.retriever.groups import GroupSampler, TrainGroup
from gsdistill.retriever.model import DualEncoder
from gsdistill.retriever.train_support import (  # re-exported: older imports
    PassageCache, RetrieverEngine, StepStream, init_distributed, local_device, sync_gradients,
)

__all__ = ["PassageCache", "RetrieverEngine", "RetrieverTrainer", "StepStream", "build_loss", "build_model",
           "init_distributed", "resolve_device", "sync_gradients"]


def build_model(cfg: DictConfig) -> DualEncoder:
    m = cfg.model
    return DualEncoder(m.encoder, shared=m.shared, pooling=m.pooling, normalize=m.normalize,
                       temperature=m.temperature, learn_temperature=m.learn_temperature,
                       query_max_length=m.query_max_length, passage_max_length=m.passage_max_length,
                       freeze_passage=m.freeze_passage, train_top_layers=m.train_top_layers)


def check_batch_coupled_loss(cfg: DictConfig) -> None:
    """Warn when the batch Wasserstein loss gets shared in-batch columns.

    That loss compares the batch's rows as one distribution, so it cannot tell which query a row
    belongs to: over shared columns one query's scores can match another query's target. Measured
    (``docs/retrievers.md``): with 650 extra training queries the loss fell from 0.55 to 0.01 while
    held-out nDCG@10 fell from 0.42-0.58 to 0.02-0.10. Paper 002's text scores each query against its own
    ranking context (``loss.in_batch=false``, ``objective.own_context_loss``); SyCL's code uses
    in-batch columns, so that setting stays allowed.
    """
    names = [cfg.loss.name] + ([cfg.curriculum.stage2_loss] if cfg.curriculum.stage2_epochs > 0 else [])
    if cfg.loss.in_batch and any(loss_key(n) == "wasserstein" for n in names):
        warnings.warn("loss wasserstein with loss.in_batch=true: the batch W2 compares rows as a distribution, so "
                      "over shared in-batch candidates one query can take another query's target (measured: "
                      "held-out nDCG@10 0.56 -> 0.02 on a long run); loss.in_batch=false scores each query "
                      "against its own ranking context (paper 002)", stacklevel=2)


def build_loss(name: str, kwargs: dict, seed: int) -> torch.nn.Module:
    kwargs = dict(kwargs)
    if name == "rand1_lh":
        kwargs.setdefault("seed", seed)
    from gsdistill.retriever.st_mnrl import EXTRA_LOSSES
    return EXTRA_LOSSES[name](**kwargs) if name in EXTRA_LOSSES else get_loss(name, **kwargs)


class RetrieverTrainer:
    """``RetrieverTrainer(cfg, data, run_dir).fit() -> DualEncoder`` (trained; ``save()`` writes run_dir/model)."""

    def __init__(self, cfg: DictConfig, data: RetrievalData, run_dir: str | Path,
                 qrels: dict[str, dict[str, int]] | None = None, model: DualEncoder | None = None,
                 passage_embeddings: torch.Tensor | None = None, progress: bool = True,
                 mined_negatives: dict[str, list[int]] | None = None, remine=None, on_epoch_end=None,
                 resume: "resuming.Resume | None" = None):
        self.cfg, self.data, self.run_dir, self.progress = cfg, data, Path(run_dir), progress
        self.resume = resume  # checked by the caller before it wrote anything (pipeline); else in fit()
        self.on_epoch_end = on_epoch_end  # on_epoch_end(epoch, model) after every epoch (dev selection)
        if on_epoch_end is not None and (cfg.train.resume or cfg.train.stop_after is not None):
            raise ValueError("selection after every epoch (data.dev_split) keeps the best weights in memory; "
                             "it cannot be combined with train.resume or train.stop_after")
        self.rank, self.world = rank_and_world()
        if cfg.train.amp not in ("auto", "bf16", "fp16", "off"):
            raise ValueError(f"train.amp must be auto, bf16, fp16 or off, got {cfg.train.amp!r}")
        if cfg.weakening.enabled and loss_kind(cfg.loss.name) == "graded":
            raise ValueError(f"weakening.enabled widens the positive set; graded loss {cfg.loss.name!r} "
                             "takes grades, not positives (use superset_pairwise or a multi-positive loss)")
        check_batch_coupled_loss(cfg)
        self.qrels = data.qrels if qrels is None else qrels  # noisy labels go here
        torch.manual_seed(cfg.train.seed)
        self.device = local_device(cfg.train.device)  # cuda:LOCAL_RANK, made current under torchrun
        self.model = (model or build_model(cfg)).to(self.device)
        self.cache = None
        if self.model.freeze_passage:
            self.cache = PassageCache(self.model, data.doc_texts, cfg.eval.batch_size, passage_embeddings)
        train_view = RetrievalData(data.doc_ids, data.doc_texts, data.queries, self.qrels, data.negatives,
                                   data.skipped, data.source)
        self.sampler = GroupSampler(train_view, cfg.groups.size, cfg.groups.max_positives, cfg.train.seed,
                                    mined_negatives)
        self.remine = remine  # remine(model) -> fresh mined lists at each later epoch start
        plan = self.epoch_plan()
        self.losses = {name: build_loss(name, cfg.loss.kwargs if name == cfg.loss.name else {}, cfg.train.seed)
                       for name in dict.fromkeys(plan)}
        self.engine = RetrieverEngine(self, self.losses)
        self.stream = StepStream(self, plan, self.rank, self.world)
        self.history: list[dict] = []
        self.loop: Trainer | None = None

    def loop_plan(self) -> LoopPlan:
        t, steps = self.cfg.train, max(1, self.stream.steps)
        lr, warm = float(t.lr), int(t.warmup_ratio * steps)
        return LoopPlan(steps=steps, lr_at=lambda s: linear_with_warmup(s, steps, lr, warm),
                        stop_after=None if t.stop_after is None else int(t.stop_after),
                        log_every=int(t.log_every), ckpt_every=int(t.ckpt_every), save_at_end=int(t.ckpt_every) > 0,
                        keep_checkpoints=int(t.keep_checkpoints), tensorboard=True, progress=self.progress,
                        plots=True, plot_terms=("total", "temperature"), engine="retriever", name="retriever train",
                        check_every_step=bool(t.debug_checks), lr_key="train.lr", warmup_key="train.warmup_ratio")

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

    def epoch_plan(self) -> list[str]:
        return resuming.epoch_plan(self.cfg)

    def fit(self) -> DualEncoder:
        """Train (or continue ``train.resume``) along the epoch plan; ``history`` gets one row per
        optimiser step (``loss`` = the step's mean loss, ``loss_name``, ``epoch``, ``lr``, ...)."""
        resume = self.resume
        if resume is None and self.cfg.train.resume:  # a trainer used on its own: refused before any write
            resume = resuming.plan_resume(self.cfg, resuming.find_checkpoint(self.cfg))
        if resume is None:
            data = resuming.data_record(self.cfg, self.data)
        else:
            data = resume.data or resuming.check_data(resume, self.cfg, self.data)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.loop = Trainer(self.cfg, self.run_dir, self.engine, self.stream, self.rank, self.world, self.device,
                            plan=self.loop_plan())
        self.loop.run_info = {"data": data}  # in every checkpoint: what a resume must read again
        if resume is not None:
            self.loop.resume(resume.ckpt)
        if self.rank == 0:  # only now: a resume that fails leaves the run's config.yaml as it was
            save_config(self.cfg, self.run_dir)
            resuming.announce(resume, self.run_dir, data, self.world)
        self.model.train()
        resuming.fit_recorded(self.loop, self.run_dir, self.rank)
        if self.on_epoch_end is not None:  # the last epoch ends with the loop
            self.on_epoch_end(len(self.epoch_plan()) - 1, self.model)
        self.history = [{**row, "loss": row["total"]} for row in self.loop.history]
        return self.model

    def save(self, metrics: dict | None = None) -> Path:
        card = {"data": f"{self.data.source} ({len(self.sampler.qids)} training queries)",
                "loss": " then ".join(dict.fromkeys(self.epoch_plan())) +
                        (" with label weakening" if self.cfg.weakening.enabled else ""),
                "training": to_dict(self.cfg.train), "metrics": metrics or {}}
        return self.model.save_pretrained(self.run_dir / "model", card, also=lambda folder: save_config(self.cfg, folder))
