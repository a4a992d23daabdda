"""Benchmark: one retriever training step of gsdistill vs sentence-transformers'
MultipleNegativesRankingLoss (MNRL) on the same model, batch and data, measured side by side.

Both train all-MiniLM-L6-v2 (shared tower, mean pooling, scale 20 = temperature 0.05) on the
same (query, positive, hard negative) triples of the BEIR dbpedia subset: gsdistill uses groups of
G=2 with SingleLH over all in-batch passages, which is what MNRL computes. Both loops include
tokenisation, forward, backward and a fused AdamW step; the two are interleaved step by step so
load from other processes hits both alike. Also: corpus-encoding throughput of
``DualEncoder.encode`` vs ``SentenceTransformer.encode``.

    .venv/bin/python tools/bench_retriever.py [--batch 16] [--steps 6] [--max-length 128] [--docs 512]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from gsdistill.config import load_config
from gsdistill.models.text_encoder import default_encoder_path
from gsdistill.retriever.beir import load_beir
from gsdistill.retriever.groups import GroupSampler, TrainGroup
from gsdistill.retriever.train import RetrieverTrainer
from gsdistill.threads import apply_threads


def triples(data, n: int) -> list[TrainGroup]:
    groups = GroupSampler(data, group_size=2, max_positives=1, seed=0).epoch_groups(0)
    return (groups * (n // len(groups) + 1))[:n]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "beir_dbpedia_subset"))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--docs", type=int, default=512)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a crowded machine)")
    args = p.parse_args(argv)
    apply_threads(args.threads)
    from sentence_transformers import SentenceTransformer
    try:  # the module moved in sentence-transformers 6
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss

    torch.manual_seed(0)
    data = load_beir(args.data)
    cfg = load_config("retriever", None, [f"data.path={args.data}", "loss.name=single_lh", "groups.size=2",
                                          "groups.max_positives=1", "model.temperature=0.05", "train.lr=1.0e-5",
                                          f"model.query_max_length={args.max_length}",
                                          f"model.passage_max_length={args.max_length}", "train.warmup_ratio=0"])
    ours = RetrieverTrainer(cfg, data, "/tmp/bench_retriever_unused", progress=False)
    ours.model.train()

    st = SentenceTransformer(str(default_encoder_path()), device=str(ours.device))
    st.max_seq_length = args.max_length
    st.train()
    mnrl = MultipleNegativesRankingLoss(st, scale=20.0)
    opt_st = torch.optim.AdamW(st.parameters(), lr=1e-5, weight_decay=0.01, fused=True)

    def step_ours(batch):  # one step of the shared loop's engine: forward + backward, then clip + AdamW
        terms = ours.engine.forward({"micro": [batch], "loss_name": "single_lh", "weak": None})
        ours.engine.backward_step(terms["total"], 1.0e-5)

    def step_st(batch):
        tokenize = getattr(st, "preprocess", st.tokenize)  # sentence-transformers >= 6 renamed it
        q = tokenize([data.queries[g.qid] for g in batch])
        pos = tokenize([data.doc_texts[g.doc_idx[0]] for g in batch])
        neg = tokenize([data.doc_texts[g.doc_idx[1]] for g in batch])
        feats = [{k: (v.to(st.device) if torch.is_tensor(v) else v) for k, v in f.items()} for f in (q, pos, neg)]
        loss = mnrl(feats, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(st.parameters(), 1.0)
        opt_st.step()
        opt_st.zero_grad(set_to_none=True)

    batches = [triples(data, args.batch * (args.steps + 1))[i * args.batch:(i + 1) * args.batch]
               for i in range(args.steps + 1)]
    times = {"gsdistill": [], "st_mnrl": []}
    for i, batch in enumerate(batches):
        for name, fn in (("gsdistill", step_ours), ("st_mnrl", step_st)) if i % 2 == 0 else \
                (("st_mnrl", step_st), ("gsdistill", step_ours)):
            t0 = time.perf_counter()
            fn(batch)
            if i > 0:  # step 0 is warm-up
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"device {ours.device}, threads {torch.get_num_threads()}, batch {args.batch} queries "
          f"(+{2 * args.batch} passages), max_length {args.max_length}, {args.steps} timed steps each")
    print(f"train step  gsdistill {med['gsdistill']:.3f} s   sentence-transformers MNRL {med['st_mnrl']:.3f} s   "
          f"ratio {med['gsdistill'] / med['st_mnrl']:.3f}x  (goal <= 1.1x)")

    texts = data.doc_texts[:args.docs]
    rates = {"gsdistill": [], "st": []}
    for _ in range(2):
        t0 = time.perf_counter()
        ours.model.encode(texts, "passage", 64)
        rates["gsdistill"].append(len(texts) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        st.encode(texts, batch_size=64, convert_to_tensor=True, normalize_embeddings=True)
        rates["st"].append(len(texts) / (time.perf_counter() - t0))
    best = {k: max(v) for k, v in rates.items()}
    print(f"encode {len(texts)} passages  gsdistill {best['gsdistill']:.1f} docs/s   sentence-transformers "
          f"{best['st']:.1f} docs/s   ratio {best['gsdistill'] / best['st']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
