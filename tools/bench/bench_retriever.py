"""Benchmark: the retriever training step a user waits for, with every loss of the NFCorpus table,
against a sentence-transformers MultipleNegativesRankingLoss (MNRL) step, measured side by side.

``--mode table`` (default): the table's settings (configs/retriever/nfcorpus_base.yaml laid over
each loss file, as tools/experiments/retriever_table.py does): all-MiniLM-L6-v2 query tower trained, passage
tower frozen with its embeddings cached, batch 32 queries, each loss's own groups (G = 8, M = 4;
SingleLH M = 1; MNRL G = 2). One gsdistill step = the table's engine step (tokenise, forward,
loss, backward, clip, fused AdamW). The sentence-transformers step gets the same advantage: a
``SentenceTransformer`` of the same encoder encodes the 32 queries through its own
``preprocess`` + forward, ``MultipleNegativesRankingLoss.compute_loss_from_embeddings`` scores
them against the same cached (positive, hard negative) embeddings, then backward, clip, fused
AdamW. Steps alternate (gsdistill, ST, ST, gsdistill, ...) so load from other processes hits both
alike; medians after one warm-up. Label weakening also pays, once per epoch, the scoring of every
training group by the current model; it is printed per step of an epoch.

``--mode shared``: both towers (one shared MiniLM), batch 16 (query, positive, hard negative)
triples at length 128: gsdistill SingleLH over G = 2 groups vs the complete sentence-transformers
MNRL step (its tokenisation and forward of queries and passages).

    .venv/bin/python tools/bench/bench_retriever.py [--mode table|shared] [--steps 5] [--only LOSS ...]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from gsdistill.models.text_encoder import default_encoder_path
from gsdistill.retriever.groups import GroupSampler
from gsdistill.retriever.pipeline import load_split
from gsdistill.retriever.train import RetrieverTrainer
from gsdistill.threads import apply_threads
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))  # the table's own rows
from retriever_table import ROWS, row_config  # noqa: E402


def st_parts(lr: float, max_length: int):
    """A sentence-transformers model of the encoder, its MNRL (scale 20 = temperature 0.05), AdamW."""
    from sentence_transformers import SentenceTransformer
    try:  # the module moved in sentence-transformers 6
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss
    st = SentenceTransformer(str(default_encoder_path()), device="cpu")
    st.max_seq_length = max_length
    st.train()
    opt = torch.optim.AdamW(st.parameters(), lr=lr, weight_decay=0.01, fused=True)
    return st, MultipleNegativesRankingLoss(st, scale=20.0), opt


def st_embed(st, texts: list[str]) -> torch.Tensor:
    tokenize = getattr(st, "preprocess", st.tokenize)  # sentence-transformers >= 6 renamed it
    feats = {k: (v.to(st.device) if torch.is_tensor(v) else v) for k, v in tokenize(texts).items()}
    return st(feats)["sentence_embedding"]


def st_update(st, opt, loss: torch.Tensor) -> None:
    loss.backward()
    torch.nn.utils.clip_grad_norm_(st.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def interleaved(fns: dict, batches: list) -> dict[str, float]:
    """Median seconds per step of each ``fn(batch)``, order alternating per batch; batch 0 warms up."""
    times = {k: [] for k in fns}
    for i, batch in enumerate(batches):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            t0 = time.perf_counter()
            fns[name](batch)
            if i > 0:
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def engine_step(trainer: RetrieverTrainer, loss_name: str, weak=None):
    def step(groups):
        terms = trainer.engine.forward({"micro": [groups], "loss_name": loss_name, "weak": weak})
        trainer.engine.backward_step(terms["total"], float(trainer.cfg.train.lr))
    return step


def table_mode(args) -> None:
    losses = {}  # one timing per distinct (loss, groups, in_batch): the noise rows share CE's step
    for key, label, exp, extra in ROWS:
        if exp is None or "max_train_queries" in " ".join(extra):
            continue
        cfg = row_config("nfcorpus_base", exp, [*extra, "noise.ratio=0", f"run.dir={args.tmp}"])
        sig = (cfg.loss.name, cfg.groups.size, cfg.groups.max_positives, cfg.loss.in_batch, cfg.weakening.enabled)
        if sig not in losses and (not args.only or cfg.loss.name in args.only):
            losses[sig] = (label.replace(", 30% noise", ""), cfg)
    base = row_config("nfcorpus_base", None, [f"run.dir={args.tmp}"])
    train = load_split(base)[1]
    emb_path = Path(args.corpus_emb)
    emb = torch.load(emb_path, weights_only=True) if emb_path.is_file() else None
    st, mnrl, opt = st_parts(float(base.train.lr), int(base.model.query_max_length))
    bs, n = int(base.train.batch_size), args.steps + 1
    print(f"table settings: batch {bs} queries, query tower trained, passage tower frozen (cached), "
          f"threads {torch.get_num_threads()}, {args.steps} timed steps each after 1 warm-up")
    print("| loss | gsdistill step | ST MNRL step | ratio (goal <= 1.1x) |\n| --- | --- | --- | --- |")
    for label, cfg in losses.values():
        trainer = RetrieverTrainer(cfg, train, args.tmp, passage_embeddings=emb, progress=False)
        groups = trainer.sampler.epoch_groups(0)[:bs * n]
        batches = [groups[i * bs:(i + 1) * bs] for i in range(n)]
        trainer.cache.get(torch.tensor([i for g in groups for i in g.doc_idx]))  # filled before timing
        weak, epoch_s = None, 0.0
        if cfg.weakening.enabled:
            t0 = time.perf_counter()
            weak = trainer.weak_positive_sets(trainer.sampler.epoch_groups(0))
            epoch_s = time.perf_counter() - t0
        triples = GroupSampler(train, 2, 1, 0).epoch_groups(0)[:bs * n]  # MNRL's (query, positive, negative)
        cache = trainer.cache

        def st_step(i, triples=triples, cache=cache):
            part = triples[i * bs:(i + 1) * bs]
            q = st_embed(st, [train.queries[g.qid] for g in part])
            pos, neg = (cache.get(torch.tensor([g.doc_idx[j] for g in part])) for j in (0, 1))
            st_update(st, opt, mnrl.compute_loss_from_embeddings([q, pos, neg], None))

        ours = engine_step(trainer, cfg.loss.name, weak)
        med = interleaved({"ours": lambda i: ours(batches[i]), "st": st_step}, list(range(n)))
        steps_per_epoch = -(-len(train.judged_queries()) // bs)
        note = f" (+{epoch_s / steps_per_epoch:.3f} s/step: groups re-scored each epoch)" if epoch_s else ""
        print(f"| {label} | {med['ours']:.3f} s{note} | {med['st']:.3f} s | {med['ours'] / med['st']:.2f}x |",
              flush=True)


def shared_mode(args) -> None:
    base = row_config("nfcorpus_base", None, [f"run.dir={args.tmp}", "loss.name=single_lh", "groups.size=2",
                                              "groups.max_positives=1", "model.shared=true",
                                              "model.freeze_passage=false", "model.query_max_length=128"])
    train = load_split(base)[1]
    bs, n = 16, args.steps + 1
    trainer = RetrieverTrainer(base, train, args.tmp, progress=False)
    groups = trainer.sampler.epoch_groups(0)[:bs * n]
    st, mnrl, opt = st_parts(float(base.train.lr), 128)

    def st_step(part):
        embs = [st_embed(st, texts) for texts in ([train.queries[g.qid] for g in part],
                                                  [train.doc_texts[g.doc_idx[0]] for g in part],
                                                  [train.doc_texts[g.doc_idx[1]] for g in part])]
        st_update(st, opt, mnrl.compute_loss_from_embeddings(embs, None))

    med = interleaved({"ours": engine_step(trainer, "single_lh"), "st": st_step},
                      [groups[i * bs:(i + 1) * bs] for i in range(n)])
    print(f"shared tower, batch {bs} triples, length 128: gsdistill {med['ours']:.3f} s, sentence-transformers "
          f"MNRL {med['st']:.3f} s, ratio {med['ours'] / med['st']:.2f}x (goal <= 1.1x)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["table", "shared"], default="table")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--only", nargs="*", default=None, help="loss names to time (table mode)")
    p.add_argument("--corpus-emb", default="runs/retriever_nfcorpus/corpus_emb.pt",
                   help="the table's cached passage embeddings (else the timed batches' passages are encoded first)")
    p.add_argument("--tmp", default="/tmp/bench_retriever_unused")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a crowded machine)")
    args = p.parse_args(argv)
    apply_threads(args.threads)
    torch.manual_seed(0)
    (table_mode if args.mode == "table" else shared_mode)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
