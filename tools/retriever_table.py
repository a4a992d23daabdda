"""Real-data table: retriever losses on BEIR dbpedia (graded, multi-positive) with mined hard
negatives, over query folds and seeds, each paired against zero-shot MiniLM on the same fold.

    .venv/bin/python tools/retriever_table.py [--out runs/retriever_table] [--folds 4] [--seeds 0 1 2 3]
        [--epochs E] [--only KEY ...] [--set key=value ...]

Rows: zero-shot; SingleLH, LSEPair, SumMargLH, Wasserstein (own ranking context) and
sentence-transformers' MNRL (same mined negatives, same loop); then paper 004's comparison at 30%
injected label noise: CE (= the multi-positive cross-entropy SumMargLH), NCE, GCE, AGCE, AUL, LS,
ELS, LR, NCE+AGCE, NCE+AUL and label weakening. The frozen passage tower's corpus embeddings are
computed once and cached in OUT (keyed by encoder, max length, pooling and corpus size); mined
negatives are cached in OUT/mined_negatives (keyed by what produced them). Results: OUT/results.csv
(one line per run; a rerun skips runs already there), OUT/per_query/ (per-query nDCG@10 of every
run), OUT/table.md and OUT/table.png (nDCG@10 per method).
The Δ column is the mean paired nDCG@10 difference to zero-shot over the 40 queries (each query's
difference averaged over seeds) with a 95% paired bootstrap interval; "> 0-shot" counts runs whose
fold mean beats zero-shot's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from gsdistill.config import load_config
from gsdistill.retriever.evaluate import encode_corpus, evaluate_retriever
from gsdistill.retriever.loading import load_retrieval_data, train_test_queries
from gsdistill.retriever.pipeline import train_and_evaluate
from gsdistill.retriever.significance import paired_bootstrap, paired_differences
from gsdistill.retriever.train import build_model
from gsdistill.run_log import append_row, bar_plot, read_rows

NOISY = "noisy_sum_marg_lh"  # SumMargLH base with noise.ratio = 0.3
ROWS = [  # (key, label, experiment file, extra overrides)
    ("zero_shot", "zero-shot MiniLM", None, []),
    ("single_lh", "SingleLH", "single_lh", []),
    ("lse_pair", "LSEPair", "lse_pair", []),
    ("sum_marg_lh", "SumMargLH", "sum_marg_lh", []),
    ("wasserstein", "Wasserstein (graded, own ranking context)", "wasserstein", []),
    ("st_mnrl", "sentence-transformers MNRL", "st_mnrl", []),
    ("noisy_ce", "CE (SumMargLH), 30% noise", NOISY, []),
    ("noisy_nce", "NCE, 30% noise", NOISY, ["loss.name=nce"]),
    ("noisy_gce", "GCE, 30% noise", NOISY, ["loss.name=gce"]),
    ("noisy_agce", "AGCE, 30% noise", NOISY, ["loss.name=agce"]),
    ("noisy_aul", "AUL, 30% noise", NOISY, ["loss.name=aul"]),
    ("noisy_ls", "LS, 30% noise", NOISY, ["loss.name=label_smoothing"]),
    ("noisy_els", "ELS, 30% noise", NOISY, ["loss.name=els"]),
    ("noisy_lr", "LR, 30% noise", NOISY, ["loss.name=label_relaxation"]),
    ("noisy_nce_agce", "NCE+AGCE, 30% noise", NOISY, ["loss.name=nce_agce"]),
    ("noisy_nce_aul", "NCE+AUL, 30% noise", NOISY, ["loss.name=nce_aul"]),
    ("label_weakening", "Label weakening, 30% noise", "label_weakening", []),
]
MEASURES = ["nDCG@10", "MRR@10", "R@20", "R@100"]
FIELDS = ["key", "row", "fold", "seed", *MEASURES, "train_seconds", "first_loss", "last_loss",
          "noise_achieved", "mined_per_query"]


def corpus_embeddings(cfg, out: Path) -> torch.Tensor:
    data = load_retrieval_data(cfg.data.format, cfg.data.path, cfg.data.corpus, cfg.data.split)
    key = {"encoder": cfg.model.encoder, "max_length": cfg.model.passage_max_length, "docs": len(data.doc_ids),
           "pooling": cfg.model.pooling, "normalize": cfg.model.normalize}
    path, meta = out / "corpus_emb.pt", out / "corpus_emb.json"
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()) == key:
        return torch.load(path, weights_only=True)
    t0 = time.perf_counter()
    emb = encode_corpus(build_model(cfg), data, cfg.eval.batch_size, progress=True)
    print(f"encoded {len(data.doc_ids)} passages in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    torch.save(emb, path)
    meta.write_text(json.dumps(key))
    return emb


def done_runs(results: Path) -> set[tuple[str, int, int]]:
    if not results.is_file():
        return set()
    return {(r["key"], int(r["fold"]), int(r["seed"])) for r in read_rows(results)}


def run_all(args) -> list[dict]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [f"data.path={args.data}", f"data.folds={args.folds}", f"negatives.cache_dir={out / 'mined_negatives'}",
              *([f"train.epochs={args.epochs}"] if args.epochs else []), *args.set]
    base = load_config("retriever", "dbpedia_base", common)
    emb = corpus_embeddings(base, out)
    results, done = out / "results.csv", done_runs(out / "results.csv")
    for key, label, exp, extra in ROWS:
        if args.only and key not in args.only:
            continue
        for fold in range(args.folds):
            for seed in ([0] if exp is None else args.seeds):
                if (key, fold, seed) in done:
                    continue
                row = one_run(key, label, exp, extra, fold, seed, common, base, emb, out)
                append_row(results, row, FIELDS)  # one line per finished run: a rerun skips it
                print(f"{label:30s} fold {fold} seed {seed}: nDCG@10 {row['nDCG@10']:.4f} "
                      f"({row['train_seconds']:.0f} s)", file=sys.stderr)
    return read_rows(results)


def one_run(key, label, exp, extra, fold, seed, common, base, emb, out: Path) -> dict:
    overrides = [*common, *extra, f"data.fold={fold}", f"train.seed={seed}", f"noise.seed={seed}"]
    run_dir = out / "runs" / f"{key}-f{fold}-s{seed}"
    if exp is None:  # zero-shot: the untrained encoder on the held-out fold
        data = load_retrieval_data(base.data.format, base.data.path, None, base.data.split)
        _, test_q = train_test_queries(data, base.data.folds, fold, base.data.fold_seed)
        res = evaluate_retriever(build_model(base), data.subset(test_q), k=base.eval.k, measures=MEASURES,
                                 doc_emb=emb, progress=False, out_dir=run_dir / "eval")
        summary = {"eval": res, "train_seconds": 0.0, "first_loss": "", "last_loss": "", "noise": None,
                   "negatives": None}
    else:
        cfg = load_config("retriever", exp, overrides)
        summary = train_and_evaluate(cfg, run_dir, passage_embeddings=emb, progress=False, save_model=False)
    per_query = json.loads((run_dir / "eval" / "per_query.json").read_text())
    (out / "per_query").mkdir(exist_ok=True)
    (out / "per_query" / f"{key}-f{fold}-s{seed}.json").write_text(
        json.dumps({q: v["nDCG@10"] for q, v in per_query.items()}))
    m = summary["eval"]["metrics"]
    return {"key": key, "row": label, "fold": fold, "seed": seed, **{k: m[k] for k in MEASURES},
            "train_seconds": summary["train_seconds"], "first_loss": summary["first_loss"],
            "last_loss": summary["last_loss"], "noise_achieved": (summary["noise"] or {}).get("achieved_rate", ""),
            "mined_per_query": (summary["negatives"] or {}).get("mean_per_query", "")}


def per_query_of(out: Path, key: str, runs: list[dict]) -> list[dict[str, float]]:
    return [json.loads((out / "per_query" / f"{key}-f{r['fold']}-s{r['seed']}.json").read_text()) for r in runs]


def write_table(rows: list[dict], out: Path) -> str:
    """Mean ± sample std over runs; paired Δ nDCG@10 vs zero-shot with a 95% bootstrap interval."""
    zero_runs = [r for r in rows if r["key"] == "zero_shot"]
    zero_q: dict[str, float] = {}
    for d in per_query_of(out, "zero_shot", zero_runs):
        zero_q.update(d)
    zero_fold = {int(r["fold"]): float(r["nDCG@10"]) for r in zero_runs}
    lines = ["| method | runs | " + " | ".join(MEASURES) + " | Δ nDCG@10 vs zero-shot [95% CI] | > 0-shot |",
             "| --- | --- |" + " --- |" * (len(MEASURES) + 2)]
    for key, label, exp, _ in ROWS:
        mine = [r for r in rows if r["key"] == key]
        if not mine:
            continue
        cells = [f"{statistics.mean(float(r[m]) for r in mine):.4f} ± {_sd([float(r[m]) for r in mine]):.4f}"
                 for m in MEASURES]
        if exp is not None and zero_q:
            by_seed: dict[str, dict[str, float]] = {}
            for r, d in zip(mine, per_query_of(out, key, mine)):
                by_seed.setdefault(r["seed"], {}).update(d)
            diffs = paired_differences(list(by_seed.values()), zero_q)
            mean, low, high = paired_bootstrap(list(diffs.values()))
            above = sum(float(r["nDCG@10"]) > zero_fold.get(int(r["fold"]), float("inf")) for r in mine)
            cells += [f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]", f"{above}/{len(mine)}"]
        else:
            cells += ["", ""]
        lines.append(f"| {label} | {len(mine)} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    plot_table(rows, out / "table.png")
    return table


def plot_table(rows: list[dict], path: Path) -> Path | None:
    """nDCG@10 of every method, mean ± sample std over its runs, as horizontal bars."""
    keys = [(key, label) for key, label, _, _ in ROWS if any(r["key"] == key for r in rows)]
    if not keys:
        return None
    runs = [[float(r["nDCG@10"]) for r in rows if r["key"] == key] for key, _ in keys]
    return bar_plot(path, [label for _, label in keys],
                    {"nDCG@10 (mean ± std over runs)": ([statistics.mean(v) for v in runs], [_sd(v) for v in runs])})


def _sd(vals: list[float]) -> float:
    return statistics.stdev(vals) if len(vals) > 1 else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"
                                         / "beir_dbpedia_subset"))
    p.add_argument("--out", default="runs/retriever_table")
    p.add_argument("--folds", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3],
                   help="seeds per fold (4: two seed pairs gave intervals on both sides of 0)")
    p.add_argument("--epochs", type=int, default=0, help="train.epochs of every row (0 = the experiment files')")
    p.add_argument("--set", nargs="*", default=[], help="extra key=value overrides for every row")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a crowded machine)")
    p.add_argument("--only", nargs="*", default=None, help="row keys to run (zero_shot for the baseline)")
    p.add_argument("--table-only", action="store_true", help="write the table from results.csv, run nothing")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = read_rows(Path(args.out) / "results.csv") if args.table_only else run_all(args)
    print(write_table(rows, Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
