"""Config -> data -> (noise) -> training -> held-out evaluation -> saved model, as one call.

Used by ``gsdistill retriever train`` and by ``tools/experiments/retriever_table.py``. With a frozen passage
tower the corpus is encoded once, and those embeddings serve label-noise injection, training and
evaluation alike; pass ``passage_embeddings`` to reuse them across runs.

Under ``torchrun`` every rank runs this; they share one run folder (rank 0 names it and broadcasts
the name), rank 0 alone locks it and writes files (data summary, mined-negative cache, checkpoints,
evaluation, model) and hands the mined negatives to the other ranks. A run folder that holds an
earlier run is refused unless ``overwrite`` (``run_folder.py``); a resume is checked against the
run's own config and data before anything is written (``resume.py``).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from gsdistill.losses.gather import is_distributed
from gsdistill.pretrain.distributed import rank_and_world
from gsdistill.retriever.data import RetrievalData
from gsdistill.retriever.evaluate import encode_corpus, evaluate_retriever
from gsdistill.retriever.loading import limit_queries, load_retrieval_data, train_test_queries
from gsdistill.retriever.mining import cached_negatives, check_method, mine_negatives, mining_key
from gsdistill.retriever.noise import inject_label_noise
from gsdistill.retriever.resume import (
    Resume, absolute_data_paths, check_data, find_checkpoint, plan_resume, run_folder_of,
)
from gsdistill.retriever.run_folder import claim_run_folder
from gsdistill.retriever.selection import EpochSelector
from gsdistill.retriever.train import RetrieverTrainer, build_model, init_distributed


def _from_rank0(value):
    """Rank 0's ``value`` on every rank (a broadcast of a picklable object); itself when alone."""
    if rank_and_world()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def make_run_dir(cfg: DictConfig, found: tuple[Path, list[str]] | None = None) -> Path:
    """``run.dir/run.name``; without a name the resumed checkpoint's own run folder (``found``, see
    :func:`find_checkpoint`), else ``run.dir/<loss>-<timestamp>``: rank 0's clock names the folder of
    every rank (ranks start seconds apart, and each would name its own). A collective."""
    if not cfg.run.name and found is not None and run_folder_of(found[0]) is not None:
        return run_folder_of(found[0])
    name = cfg.run.name or _from_rank0(f"{cfg.loss.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    return Path(cfg.run.dir) / name


def load_split(cfg: DictConfig) -> tuple[RetrievalData, RetrievalData, RetrievalData | None]:
    """(data as loaded, train data, eval data or None) from ``data.*``: the eval data is
    ``data.eval_split`` (of ``data.eval_path`` or ``data.path``), else ``data.eval_path``, else the
    held-out fold; None when none is named (train only)."""
    d = cfg.data
    data = load_retrieval_data(d.format, d.path, d.corpus, d.split)
    if d.eval_split or d.dev_split:
        if d.format != "beir":
            raise ValueError("data.eval_split / data.dev_split name BEIR qrels splits; data.format is "
                             f"{d.format!r} (use data.eval_path)")
        if d.folds and d.folds >= 2:
            raise ValueError("data.folds splits one qrels file into folds; with data.eval_split / data.dev_split "
                             "set data.folds=0 (the splits already hold disjoint queries)")
    if d.eval_split:
        evaluated = load_retrieval_data(d.format, d.eval_path or d.path, d.corpus, d.eval_split)
        return data, data, require_disjoint(data, evaluated, "data.split", "data.eval_split")
    if d.eval_path:
        return data, data, load_retrieval_data(d.format, d.eval_path, d.corpus, d.split)
    if d.folds and d.folds >= 2:
        train_q, test_q = train_test_queries(data, d.folds, d.fold, d.fold_seed)
        return data, data.subset(train_q), data.subset(test_q)
    return data, data, None


def load_dev(cfg: DictConfig, train: RetrievalData, evaluated: RetrievalData | None) -> RetrievalData | None:
    """``data.dev_split`` of ``data.path`` (selection data), or None; its queries must be neither
    trained on nor reported."""
    d = cfg.data
    if not d.dev_split:
        return None
    dev = load_retrieval_data(d.format, d.path, d.corpus, d.dev_split)
    require_disjoint(train, dev, "data.split", "data.dev_split")
    return dev if evaluated is None else require_disjoint(evaluated, dev, "data.eval_split", "data.dev_split")


def require_disjoint(a: RetrievalData, b: RetrievalData, name_a: str, name_b: str) -> RetrievalData:
    """``b``, after checking that no judged query is in both (a split evaluated on its own training
    queries, or selected on its test queries, would report a leak as a result)."""
    shared = set(a.judged_queries()) & set(b.judged_queries())
    if shared:
        raise ValueError(f"{name_a} and {name_b} share {len(shared)} judged queries (e.g. {sorted(shared)[0]}); "
                         "train, dev and test splits must hold different queries")
    return b


def report_data(parts: dict[str, RetrievalData | None], out_dir: Path, quiet: bool = False) -> dict:
    """Loader summaries of each part, printed to stderr and written to ``out_dir/data_summary.json``
    (by rank 0 alone under several processes)."""
    summary = {name: d.summary() for name, d in parts.items() if d is not None}
    if rank_and_world()[0] > 0:
        return summary
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "data_summary.json").write_text(json.dumps(summary, indent=2))
    if not quiet:
        for name, s in summary.items():
            print(f"data [{name}] {s['source']}: {s['docs']} docs, {s['judged_queries']} judged queries, "
                  f"{s['positives']} positives (grade > 0); {s['queries_without_relevant']} queries with only "
                  f"grade-0 judgements; skipped {s['skipped'] or 'nothing'}", file=sys.stderr)
    return summary


def mine_for_run(cfg: DictConfig, data: RetrievalData, qrels: dict, model, passage_embeddings, progress: bool):
    """``(mined {qid: [corpus index]}, info, remine or None)`` from ``negatives.*``; first pass with
    the model as it starts training (zero-shot), cached; ``remine(model)`` re-mines (dense) with the
    current weights. Under several processes rank 0 mines (or reads the cache) and writes it, and
    the other ranks receive its lists (a collective: every rank calls this)."""
    n = cfg.negatives
    method = check_method(n.method)
    if method == "none":
        return {}, {"method": "none"}, None
    if n.remine_every_epoch and "dense" not in method:
        raise ValueError("negatives.remine_every_epoch needs a dense method (BM25 does not change with the model)")
    qids = sorted(q for q in data.queries if any(g > 0 for g in qrels.get(q, {}).values()))
    bs = cfg.eval.batch_size

    def compute(m) -> dict[str, list[int]]:
        q_emb = doc_emb = None
        if "dense" in method:
            doc_emb = passage_embeddings if passage_embeddings is not None else encode_corpus(m, data, bs, progress)
            q_emb = m.encode([data.queries[q] for q in qids], "query", bs)
        return mine_negatives(data, qids, qrels, method, n.depth, n.skip_top, n.per_query, q_emb, doc_emb)

    settings = {"method": method, "depth": n.depth, "skip_top": n.skip_top, "per_query": n.per_query}
    unused = ("temperature", "learn_temperature", "train_top_layers")  # do not change the mining encoder
    encoder = json.dumps({k: v for k, v in model.settings().items() if k not in unused}, sort_keys=True)
    key = mining_key(data, qids, qrels, settings, encoder)
    cache = Path(n.cache_dir) if n.cache_dir else Path(cfg.run.dir) / "mined_negatives"
    found = cached_negatives(cache, key, lambda: compute(model)) if rank_and_world()[0] == 0 else None
    mined, path, reused = _from_rank0(found)
    sizes = [len(v) for v in mined.values()]
    info = {**settings, "file": str(path), "reused_cache": reused, "queries": len(mined),
            "mean_per_query": sum(sizes) / max(1, len(sizes)), "queries_without_mined": sizes.count(0),
            "remine_every_epoch": bool(n.remine_every_epoch)}
    print(f"mined negatives ({method}): {info['mean_per_query']:.1f} per query for {len(mined)} queries "
          f"({'cached ' if reused else ''}{path})", file=sys.stderr)
    return mined, info, (compute if n.remine_every_epoch else None)


def interpolate_weights(model: torch.nn.Module, start: dict[str, torch.Tensor], alpha: float) -> None:
    """WiSE-FT (Wortsman et al. 2022, "Robust fine-tuning of zero-shot models"): replace the trained
    weights by ``(1 - alpha) * start + alpha * trained`` (float tensors; buffers such as position ids
    are left as they are)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"train.interpolate must be in [0, 1], got {alpha}")
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if value.is_floating_point() and name in start:
                value.copy_((1 - alpha) * start[name].to(value.device) + alpha * value)


def train_and_evaluate(cfg: DictConfig, run_dir: str | Path | None = None,
                       passage_embeddings: torch.Tensor | None = None, progress: bool = True,
                       save_model: bool = True, augment_train=None, overwrite: bool = False,
                       config: str | None = None) -> dict:
    """Train on ``cfg`` and evaluate on the held-out data; returns the summary written to summary.json.

    ``save_model=False`` skips writing the weights (sweeps of many runs would fill the disk).
    ``augment_train(train_data) -> RetrievalData``: extra training queries (same corpus) added
    before noise and mining, e.g. ``tools/experiments/retriever_pseudo_queries.py``; the eval data is untouched.
    ``overwrite``: a run folder holding an earlier run is refused unless set; then what that run
    wrote is removed first (by the folder's record, ``run_folder.RUN``; other files stay). ``config``:
    the experiment file the config came from (an input: never inside the run folder).
    """
    init_distributed(cfg.train.device)  # sets this rank's device; joins only under torchrun (WORLD_SIZE > 1)
    absolute_data_paths(cfg)  # the saved config names the data read, wherever a resume starts
    found = find_checkpoint(cfg)
    run_dir = Path(run_dir) if run_dir is not None else make_run_dir(cfg, found)
    with claim_run_folder(cfg, run_dir, overwrite, run_folder_of(found[0]) if found else None, config):
        resume = plan_resume(cfg, found)  # a refused resume has written nothing
        return _train_and_evaluate(cfg, run_dir, resume, passage_embeddings, progress, save_model, augment_train)


def _train_and_evaluate(cfg: DictConfig, run_dir: Path, resume: Resume | None, passage_embeddings, progress: bool,
                        save_model: bool, augment_train) -> dict:
    loaded, train_data, eval_data = load_split(cfg)
    dev_data = load_dev(cfg, train_data, eval_data)
    train_data = limit_queries(train_data, cfg.data.max_train_queries, cfg.data.fold_seed)
    if augment_train is not None:
        train_data = augment_train(train_data)
    if resume is not None:
        check_data(resume, cfg, train_data)
    report_data({"loaded": loaded, "train": train_data, "dev": dev_data, "eval": eval_data}, run_dir,
                quiet=not progress)
    model = build_model(cfg)
    if cfg.model.freeze_passage and passage_embeddings is None:
        passage_embeddings = encode_corpus(model, train_data, cfg.eval.batch_size, progress)
    selector = None
    if dev_data is not None:
        selector = EpochSelector(dev_data, passage_embeddings if cfg.model.freeze_passage else None,
                                 k=cfg.eval.k, batch_size=cfg.eval.batch_size,
                                 min_relevance=cfg.eval.min_relevance, progress=progress)
    qrels, noise_stats = train_data.qrels, None
    if cfg.noise.ratio > 0:
        doc_emb = None
        if cfg.noise.similar:  # "similar" = nearest by the initial model's passage embeddings
            doc_emb = passage_embeddings if passage_embeddings is not None else encode_corpus(
                model, train_data, cfg.eval.batch_size, progress)
        qrels, noise_stats = inject_label_noise(train_data, cfg.noise.ratio, doc_emb, cfg.noise.seed)
        print(f"label noise: requested {cfg.noise.ratio:.1%}, achieved {noise_stats['achieved_rate']:.1%} "
              f"({noise_stats['replaced']} of {noise_stats['positives']} positives replaced)", file=sys.stderr)
    mined, mining_info, remine = mine_for_run(cfg, train_data, qrels, model, passage_embeddings, progress)
    trainer = RetrieverTrainer(cfg, train_data, run_dir, qrels=qrels, model=model,
                               passage_embeddings=passage_embeddings, progress=progress,
                               mined_negatives=mined, remine=remine, on_epoch_end=selector, resume=resume)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()} if cfg.train.interpolate < 1 else None
    t0 = time.perf_counter()
    trainer.fit()
    if selector is not None:
        selector.restore(trainer.model)
    if start is not None:
        interpolate_weights(trainer.model, start, cfg.train.interpolate)
    train_seconds = time.perf_counter() - t0
    if is_distributed() and torch.distributed.get_rank() > 0:  # rank 0 evaluates and saves
        return {"run_dir": str(trainer.run_dir), "train_seconds": train_seconds}
    result = None
    if eval_data is not None:
        doc_emb = passage_embeddings if cfg.model.freeze_passage else None
        if doc_emb is None and selector is not None and selector.best_epoch == len(selector.scores) - 1 \
                and cfg.train.interpolate == 1:  # the kept weights already encoded the corpus for dev
            doc_emb = selector.last_doc_emb
        result = evaluate_retriever(trainer.model, eval_data, k=cfg.eval.k, measures=list(cfg.eval.measures),
                                    doc_emb=doc_emb, batch_size=cfg.eval.batch_size, use_faiss=cfg.eval.use_faiss,
                                    out_dir=run_dir / "eval", tag=run_dir.name, progress=progress,
                                    min_relevance=cfg.eval.min_relevance)
    model_dir = trainer.save(result["metrics"] if result else None) if save_model else None
    losses = [r["loss"] for r in trainer.history]
    summary = {"run_dir": str(run_dir), "model_dir": str(model_dir) if model_dir else None,
               "train_queries": len(trainer.sampler.qids),
               "eval": result, "selection": selector.summary() if selector else None, "noise": noise_stats, "negatives": mining_info, "train_seconds": train_seconds,
               "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
