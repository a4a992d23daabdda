"""Config -> data -> (noise) -> training -> held-out evaluation -> saved model, as one call.

Used by ``gsdistill retriever train`` and by ``tools/retriever_table.py``. With a frozen passage
tower the corpus is encoded once, and those embeddings serve label-noise injection, training and
evaluation alike; pass ``passage_embeddings`` to reuse them across runs.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from gsdistill.losses.gather import is_distributed
from gsdistill.retrievers.data import RetrievalData
from gsdistill.retrievers.evaluate import encode_corpus, evaluate_retriever
from gsdistill.retrievers.loading import load_retrieval_data, train_test_queries
from gsdistill.retrievers.noise import inject_label_noise
from gsdistill.retrievers.train import RetrieverTrainer, build_model, init_distributed


def make_run_dir(cfg: DictConfig) -> Path:
    name = cfg.run.name or f"{cfg.loss.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.run.dir) / name


def split_data(cfg: DictConfig) -> tuple[RetrievalData, RetrievalData | None]:
    """(train data, eval data or None) from ``data.*``."""
    d = cfg.data
    data = load_retrieval_data(d.format, d.path, d.corpus, d.split)
    if d.eval_path:
        return data, load_retrieval_data(d.format, d.eval_path, d.corpus, d.split)
    if d.folds and d.folds >= 2:
        train_q, test_q = train_test_queries(data, d.folds, d.fold, d.fold_seed)
        return data.subset(train_q), data.subset(test_q)
    return data, None


def train_and_evaluate(cfg: DictConfig, run_dir: str | Path | None = None,
                       passage_embeddings: torch.Tensor | None = None, progress: bool = True,
                       save_model: bool = True) -> dict:
    """Train on ``cfg`` and evaluate on the held-out data; returns the summary written to summary.json.

    ``save_model=False`` skips writing the weights (sweeps of many runs would fill the disk).
    """
    run_dir = Path(run_dir) if run_dir is not None else make_run_dir(cfg)
    init_distributed()  # no-op unless launched by torchrun with WORLD_SIZE > 1
    train_data, eval_data = split_data(cfg)
    model = build_model(cfg)
    if cfg.model.freeze_passage and passage_embeddings is None:
        passage_embeddings = encode_corpus(model, train_data, cfg.eval.batch_size, progress)
    qrels, noise_stats = train_data.qrels, None
    if cfg.noise.ratio > 0:
        doc_emb = None
        if cfg.noise.similar:  # "similar" = nearest by the initial model's passage embeddings
            doc_emb = passage_embeddings if passage_embeddings is not None else encode_corpus(
                model, train_data, cfg.eval.batch_size, progress)
        qrels, noise_stats = inject_label_noise(train_data, cfg.noise.ratio, doc_emb, cfg.noise.seed)
    trainer = RetrieverTrainer(cfg, train_data, run_dir, qrels=qrels, model=model,
                               passage_embeddings=passage_embeddings, progress=progress)
    t0 = time.perf_counter()
    trainer.fit()
    train_seconds = time.perf_counter() - t0
    if is_distributed() and torch.distributed.get_rank() > 0:  # rank 0 evaluates and saves
        return {"run_dir": str(trainer.run_dir), "train_seconds": train_seconds}
    result = None
    if eval_data is not None:
        doc_emb = passage_embeddings if cfg.model.freeze_passage else None
        result = evaluate_retriever(trainer.model, eval_data, k=cfg.eval.k, measures=list(cfg.eval.measures),
                                    doc_emb=doc_emb, batch_size=cfg.eval.batch_size, use_faiss=cfg.eval.use_faiss,
                                    out_dir=run_dir / "eval", tag=run_dir.name, progress=progress)
    model_dir = trainer.save(result["metrics"] if result else None) if save_model else None
    losses = [r["loss"] for r in trainer.history]
    summary = {"run_dir": str(run_dir), "model_dir": str(model_dir) if model_dir else None, "train_queries": len(trainer.sampler.qids),
               "eval": result, "noise": noise_stats, "train_seconds": train_seconds,
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
