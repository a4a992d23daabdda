"""Experiment: more training queries for the dbpedia retriever table, made from the corpus alone.

    OMP_NUM_THREADS=1 .venv/bin/python tools/experiments/retriever_pseudo_queries.py --kind entity \
        --config sum_marg_lh --out runs/pseudo_entity [--table runs/retriever_table] [--set k=v ...]

The DBpedia subset has 30 judged training queries per fold. This adds rule-made queries over the
same 5,000 entities (no relevance judgement is read), trains with them plus the fold's real
queries, and scores the held-out fold against the zero-shot per-query nDCG@10 that
``tools/experiments/retriever_table.py`` wrote to ``--table``/per_query (paired bootstrap over the 40 queries).

- ``type``: the phrase after "is a / was an ..." in an entity's first sentence ("german actor"),
  positives = every entity with that phrase (list-search style queries);
- ``entity``: an entity's title ("Barton Fink"), positives = the entity (grade 2) and the entities
  whose text names it (grade 1; titles named by 1-30 other entities; entity-search style).
Results in docs/retrievers.md (both lower held-out nDCG@10).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch

from gsdistill.config import load_config
from gsdistill.retriever.data import RetrievalData
from gsdistill.retriever.pipeline import train_and_evaluate
from gsdistill.retriever.significance import paired_bootstrap, paired_differences

TYPE_PHRASE = re.compile(r"\b(?:is|was|are|were)\s+(?:a|an|the|one of the)\s+(.*)", re.I)
PHRASE_END = re.compile(r"[,;.(]| which | who | that | located | founded | best known")


def entity_title(doc_id: str) -> str:
    """``<dbpedia:Dan_Patrick_(politician)>`` -> ``Dan Patrick``."""
    name = doc_id.strip("<>").split(":", 1)[-1].replace("_", " ")
    return re.sub(r"\s*\(.*\)$", "", name).strip()


def type_queries(data: RetrievalData) -> dict[str, tuple[str, dict[str, int]]]:
    by_phrase: dict[str, list[str]] = defaultdict(list)
    for did, text in zip(data.doc_ids, data.doc_texts):
        first = re.split(r"(?<=[.;])\s", text, maxsplit=1)[0][:300]
        m = TYPE_PHRASE.search(first)
        if m:
            phrase = " ".join(PHRASE_END.split(m.group(1))[0].split()[:8]).lower()
            if len(phrase) >= 4:
                by_phrase[phrase].append(did)
    return {f"pseudo-type:{p}": (p, {d: 1 for d in ds}) for p, ds in by_phrase.items()}


def entity_queries(data: RetrievalData, max_mentions: int = 30) -> dict[str, tuple[str, dict[str, int]]]:
    titles = {d: entity_title(d) for d in data.doc_ids}
    titles = {d: t for d, t in titles.items() if len(t) >= 5 and not t.lower().startswith("list of")}
    by_first: dict[str, list[tuple[str, str]]] = defaultdict(list)  # first word -> titles: fewer regex runs
    for did, t in titles.items():
        by_first[t.split()[0]].append((did, t))
    named_by: dict[str, set[str]] = defaultdict(set)
    for other, text in zip(data.doc_ids, data.doc_texts):
        for word in set(re.findall(r"[\w'.-]+", text)):
            for did, t in by_first.get(word, ()):
                if did != other and re.search(r"(?<!\w)" + re.escape(t) + r"(?!\w)", text):
                    named_by[did].add(other)
    return {f"pseudo-entity:{did}": (titles[did], {did: 2, **{o: 1 for o in named_by[did]}})
            for did in titles if 1 <= len(named_by[did]) <= max_mentions}


def add_queries(kind: str):
    def augment(train: RetrievalData) -> RetrievalData:
        extra = (type_queries if kind == "type" else entity_queries)(train)
        print(f"pseudo-queries ({kind}): {len(extra)} added to {len(train.queries)} training queries", file=sys.stderr)
        return RetrievalData(train.doc_ids, train.doc_texts, {**train.queries, **{q: t for q, (t, _) in extra.items()}},
                             {**train.qrels, **{q: g for q, (_, g) in extra.items()}}, train.negatives,
                             train.skipped, train.source)
    return augment


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=("type", "entity"), required=True)
    p.add_argument("--config", default="sum_marg_lh", help="retriever experiment file (configs/retriever)")
    p.add_argument("--out", required=True)
    p.add_argument("--table", default="runs/retriever_table", help="retriever_table.py output (zero-shot, corpus embeddings)")
    p.add_argument("--folds", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--set", nargs="*", default=[], help="extra key=value overrides")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    table, out = Path(args.table), Path(args.out)
    emb = torch.load(table / "corpus_emb.pt", weights_only=True)
    zero: dict[str, float] = {}
    for f in sorted((table / "per_query").glob("zero_shot-f*-s0.json")):
        zero.update(json.loads(f.read_text()))
    by_seed: dict[int, dict[str, float]] = defaultdict(dict)
    for seed in args.seeds:
        for fold in range(args.folds):
            cfg = load_config("retriever", args.config, [
                f"data.folds={args.folds}", f"data.fold={fold}", f"train.seed={seed}",
                f"negatives.cache_dir={out / 'mined_negatives'}", *args.set])
            run_dir = out / f"f{fold}-s{seed}"
            s = train_and_evaluate(cfg, run_dir, passage_embeddings=emb, progress=False, save_model=False,
                                   augment_train=add_queries(args.kind), overwrite=True)  # the tool's own per-fold folders
            per_query = json.loads((run_dir / "eval" / "per_query.json").read_text())
            by_seed[seed].update({q: v["nDCG@10"] for q, v in per_query.items()})
            print(f"fold {fold} seed {seed}: nDCG@10 {s['eval']['metrics']['nDCG@10']:.4f}", file=sys.stderr)
    mean, low, high = paired_bootstrap(list(paired_differences(list(by_seed.values()), zero).values()))
    line = f"pseudo-queries {args.kind}, {args.config} {' '.join(args.set)}: Δ nDCG@10 vs zero-shot {mean:+.4f} [{low:+.4f}, {high:+.4f}]"
    (out / "result.txt").write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
