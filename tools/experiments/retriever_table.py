"""Real-data table: retriever losses on BEIR NFCorpus (train -> dev -> test), each paired against
zero-shot MiniLM on the same test queries.

    .venv/bin/python tools/experiments/retriever_table.py [--base nfcorpus_base] [--out runs/retriever_nfcorpus]
        [--seeds 0 1] [--both-seeds 0] [--only KEY ...] [--set key=value ...] [--table-only] [--save-best]

Every row is a loss experiment file of configs/retriever/ with the base file (``--base``) laid over
it, so every row has the same data, budget, towers and mined negatives; rows differ only in their
loss keys. Rows: zero-shot; sentence-transformers MNRL; SingleLH, Rand1LH, JointLH, SumMargLH,
LSEPair, BCE (paper 000); Wasserstein over each query's own ranking context (paper 002); paper
004's comparison at 30% injected label noise (CE = SumMargLH, NCE, GCE, AGCE, AUL, LS, ELS, LR,
NCE+AGCE, NCE+AUL, label weakening); SumMargLH and MNRL for 2 epochs with the epoch kept by dev;
SumMargLH at the setting tools/experiments/retriever_dev_sweep.py picked on dev (groups of 16, 3 epochs) beside MNRL
at 3 epochs; and, at a smaller budget (BOTH_BUDGET), key losses with both towers
trained beside the same losses with the query tower alone.

The frozen passage tower's corpus embeddings are computed once (OUT/corpus_emb.pt, keyed by encoder
and lengths) and shared by every row; mined negatives are cached in OUT/mined_negatives. Results:
OUT/results.csv (one line per run, dev and test scores; a rerun skips runs already there),
OUT/per_query/ (per-query test nDCG@10 and R@100 of every run), OUT/table.md. Δ = mean paired
difference to zero-shot over the test queries (each query's difference averaged over seeds), 95%
paired bootstrap interval. Comparisons between rows (the issue's targets and the papers' claims)
follow the table; "best multi-positive loss" is picked by mean dev nDCG@10, never by test.
``--save-best`` retrains the run with the best dev score, saves it in OUT/best/ (runs/ is git-ignored)
and checks that ``SentenceTransformer(path)`` reproduces its test nDCG@10 (OUT/best.md).
With ``--base dbpedia_base`` (query folds instead of splits) the runs go over every fold.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

from gsdistill.config import configs_dir, load_config
from gsdistill.retriever.evaluate import encode_corpus, evaluate_retriever
from gsdistill.retriever.pipeline import load_dev, load_split, train_and_evaluate
from gsdistill.retriever.significance import paired_bootstrap, paired_differences
from gsdistill.retriever.train import build_model
from gsdistill.run_log import append_row, bar_plot, read_rows

NOISY = "noisy_sum_marg_lh"  # SumMargLH with noise.ratio = 0.3
# both towers encode G passages of 128 tokens per query with gradients (~40x the query tower's step on a CPU):
# a smaller budget, the same for the two rows of each pair
BOTH_QUERIES = 160
BOTH_BUDGET = [f"data.max_train_queries={BOTH_QUERIES}", "train.batch_size=8"]
BOTH = ["model.shared=true", "model.freeze_passage=false"]
ROWS = [  # (key, label, experiment file, extra overrides): key rows first, so partial runs hold them
    ("zero_shot", "zero-shot MiniLM", None, []),
    ("sum_marg_lh", "SumMargLH", "sum_marg_lh", []),
    ("st_mnrl", "sentence-transformers MNRL", "st_mnrl", []),
    ("single_lh", "SingleLH (InfoNCE)", "single_lh", []),
    ("wasserstein", "Wasserstein (graded, own ranking context)", "wasserstein", []),
    ("noisy_ce", "CE (SumMargLH), 30% noise", NOISY, []),
    ("label_weakening", "Label weakening, 30% noise", "label_weakening", []),
    ("rand1_lh", "Rand1LH", "rand1_lh", []),
    ("joint_lh", "JointLH", "joint_lh", []),
    ("lse_pair", "LSEPair", "lse_pair", []),
    ("bce", "BCE", "bce", []),
    ("noisy_nce", "NCE, 30% noise", NOISY, ["loss.name=nce"]),
    ("noisy_gce", "GCE, 30% noise", NOISY, ["loss.name=gce"]),
    ("noisy_agce", "AGCE, 30% noise", NOISY, ["loss.name=agce"]),
    ("noisy_aul", "AUL, 30% noise", NOISY, ["loss.name=aul"]),
    ("noisy_ls", "LS, 30% noise", NOISY, ["loss.name=label_smoothing"]),
    ("noisy_els", "ELS, 30% noise", NOISY, ["loss.name=els"]),
    ("noisy_lr", "LR, 30% noise", NOISY, ["loss.name=label_relaxation"]),
    ("noisy_nce_agce", "NCE+AGCE, 30% noise", NOISY, ["loss.name=nce_agce"]),
    ("noisy_nce_aul", "NCE+AUL, 30% noise", NOISY, ["loss.name=nce_aul"]),
    ("sum_marg_lh_2ep", "SumMargLH, 2 epochs, epoch kept by dev", "sum_marg_lh", ["train.epochs=2"]),
    ("st_mnrl_2ep", "sentence-transformers MNRL, 2 epochs, epoch kept by dev", "st_mnrl", ["train.epochs=2"]),
    # the dev sweep's pick (tools/experiments/retriever_dev_sweep.py: 8 settings, seed 0, dev nDCG@10 only), and MNRL at its budget
    ("sum_marg_lh_g16_3ep", "SumMargLH, G = 16, 3 epochs, epoch kept by dev (dev sweep)", "sum_marg_lh",
     ["train.epochs=3", "groups.size=16"]),
    ("st_mnrl_3ep", "sentence-transformers MNRL, 3 epochs, epoch kept by dev", "st_mnrl", ["train.epochs=3"]),
    *[(f"{k}_{tower}", f"{label}, {'both towers' if tower == 'both' else 'query tower'}, {BOTH_QUERIES} queries", exp,
       BOTH_BUDGET + (BOTH if tower == "both" else []))
      for k, label, exp in (("sum_marg_lh", "SumMargLH", "sum_marg_lh"), ("st_mnrl", "MNRL", "st_mnrl"),
                            ("wasserstein", "Wasserstein", "wasserstein"),
                            ("label_weakening", "Label weakening 30% noise", "label_weakening"))
      for tower in ("query", "both")],
]
MULTI_POSITIVE = ["rand1_lh", "joint_lh", "sum_marg_lh", "lse_pair", "bce"]
MEASURES = ["nDCG@10", "MRR@10", "R@100"]
PAIRED = ["nDCG@10", "R@100"]
FIELDS = ["key", "row", "fold", "seed", "dev_nDCG@10", *MEASURES, "train_seconds", "first_loss", "last_loss",
          "noise_achieved", "mined_per_query"]


def row_config(base: str, exp: str, overrides: list[str]):
    """The loss file ``exp`` with the base file's keys laid over it, then ``overrides``."""
    layer = yaml.safe_load((configs_dir() / "retriever" / f"{base}.yaml").read_text())
    return load_config("retriever", exp, overrides, layers=[layer])


def corpus_embeddings(cfg, out: Path) -> torch.Tensor:
    """The untrained passage tower's corpus embeddings, computed once and cached in ``out``."""
    data = load_split(cfg)[0]
    key = {"encoder": cfg.model.encoder, "max_length": cfg.model.passage_max_length, "docs": len(data.doc_ids),
           "pooling": cfg.model.pooling, "normalize": cfg.model.normalize}
    path, meta = out / "corpus_emb.pt", out / "corpus_emb.json"
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()) == key:
        return torch.load(path, weights_only=True)
    t0 = time.perf_counter()
    emb = encode_corpus(build_model(cfg), data, cfg.eval.batch_size, progress=False)
    print(f"encoded {len(data.doc_ids)} passages in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    torch.save(emb, path)
    meta.write_text(json.dumps(key))
    return emb


def run_all(args) -> list[dict]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [f"negatives.cache_dir={out / 'mined_negatives'}", *args.set]
    base = row_config(args.base, None, common)
    emb = corpus_embeddings(base, out)
    folds = range(base.data.folds) if base.data.folds >= 2 else [0]
    results = out / "results.csv"
    done = {(r["key"], int(r["fold"]), int(r["seed"])) for r in (read_rows(results) if results.is_file() else [])}
    for key, label, exp, extra in ROWS:
        if args.only and key not in args.only:
            continue
        for fold in folds:
            for seed in ([0] if exp is None else args.both_seeds if key.endswith("_both") else args.seeds):
                if (key, fold, seed) not in done:
                    overrides = [*common, *extra, f"data.fold={fold}", f"train.seed={seed}", f"noise.seed={seed}"]
                    row = one_run(key, label, exp, overrides, args.base, emb, out / "runs" / f"{key}-f{fold}-s{seed}")
                    append_row(results, {**row, "fold": fold, "seed": seed}, FIELDS)
                    print(f"{label:45s} fold {fold} seed {seed}: test nDCG@10 {row['nDCG@10']:.4f} dev "
                          f"{row['dev_nDCG@10'] or '-'} ({row['train_seconds']:.0f} s)", file=sys.stderr, flush=True)
    return read_rows(results)


def one_run(key, label, exp, overrides, base_name, emb, run_dir: Path) -> dict:
    cfg = row_config(base_name, exp, overrides)
    if exp is None:  # zero-shot: the untrained encoder on dev and on the evaluated queries
        model, (_, train, test) = build_model(cfg), load_split(cfg)
        dev_data = load_dev(cfg, train, test)
        dev_score = (evaluate_retriever(model, dev_data, k=cfg.eval.k, measures=["nDCG@10"], doc_emb=emb,
                                        progress=False)["metrics"]["nDCG@10"] if dev_data is not None else "")
        res = evaluate_retriever(model, test, k=cfg.eval.k, measures=MEASURES, doc_emb=emb, progress=False,
                                 out_dir=run_dir / "eval")
        summary = {"eval": res, "train_seconds": 0.0, "first_loss": "", "last_loss": "", "noise": None,
                   "negatives": None, "selection": {"dev_scores": [dev_score], "best_epoch": 0}}
    else:
        cfg.eval.measures = MEASURES
        frozen = emb if cfg.model.freeze_passage else None
        # a row is (re)run only when missing from the results CSV: its folder is this tool's own, left by an unfinished try
        summary = train_and_evaluate(cfg, run_dir, passage_embeddings=frozen, progress=False, save_model=False,
                                     overwrite=True)
    per_query = json.loads((run_dir / "eval" / "per_query.json").read_text())
    (run_dir.parents[1] / "per_query").mkdir(exist_ok=True)
    (run_dir.parents[1] / "per_query" / f"{run_dir.name}.json").write_text(
        json.dumps({m: {q: v[m] for q, v in per_query.items()} for m in PAIRED}))
    m, sel = summary["eval"]["metrics"], summary.get("selection") or {}
    dev = sel["dev_scores"][sel["best_epoch"]] if sel.get("dev_scores") else ""
    return {"key": key, "row": label, "dev_nDCG@10": dev, **{k: m[k] for k in MEASURES},
            "train_seconds": summary["train_seconds"], "first_loss": summary["first_loss"],
            "last_loss": summary["last_loss"], "noise_achieved": (summary["noise"] or {}).get("achieved_rate", ""),
            "mined_per_query": (summary["negatives"] or {}).get("mean_per_query", "")}


def query_means(out: Path, key: str, rows: list[dict], measure: str) -> dict[str, float]:
    """``{qid: measure}`` of row ``key`` on each test query, averaged over seeds (folds merged: each
    query is a test query once per seed)."""
    by_seed: dict[str, dict[str, float]] = {}
    for r in (r for r in rows if r["key"] == key):
        path = out / "per_query" / f"{key}-f{r['fold']}-s{r['seed']}.json"
        by_seed.setdefault(str(r["seed"]), {}).update(json.loads(path.read_text())[measure])
    runs = list(by_seed.values())
    return {q: statistics.mean(run[q] for run in runs) for q in set.intersection(*(set(run) for run in runs))}


def paired(out: Path, rows: list[dict], a: str, b: str, measure: str = "nDCG@10") -> tuple[float, float, float]:
    """Mean paired difference row ``a`` - row ``b`` over the test queries, 95% bootstrap interval."""
    diffs = paired_differences([query_means(out, a, rows, measure)], query_means(out, b, rows, measure))
    return paired_bootstrap(list(diffs.values()))


def verdict(low: float, high: float) -> str:
    return "held" if low > 0 else "not held (the other side is better)" if high < 0 else "no measurable difference"


def write_table(rows: list[dict], out: Path) -> str:
    have = {r["key"] for r in rows}
    lines = ["| method | runs | dev nDCG@10 | " + " | ".join(f"test {m}" for m in MEASURES) +
             " | Δ nDCG@10 vs zero-shot [95% CI] | Δ R@100 vs zero-shot [95% CI] | s / run |",
             "| --- | --- |" + " --- |" * (len(MEASURES) + 4)]
    for key, label, exp, _ in ROWS:
        mine = [r for r in rows if r["key"] == key]
        if not mine:
            continue
        cells = [_mean_sd(mine, "dev_nDCG@10"), *(_mean_sd(mine, m) for m in MEASURES)]
        for m in PAIRED:
            cells.append("" if exp is None or "zero_shot" not in have else
                         "{:+.4f} [{:+.4f}, {:+.4f}]".format(*paired(out, rows, key, "zero_shot", m)))
        cells.append(f"{statistics.mean(float(r['train_seconds']) for r in mine):.0f}")
        lines.append(f"| {label} | {len(mine)} | " + " | ".join(cells) + " |")
    lines += ["", *comparisons(rows, out, have)]
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    plot_table(rows, out / "table.png")
    return table


def plot_table(rows: list[dict], path: Path) -> Path | None:
    """Test nDCG@10 of every method, mean ± sample std over its runs, as horizontal bars."""
    keys = [(key, label) for key, label, _, _ in ROWS if any(r["key"] == key for r in rows)]
    if not keys:
        return None
    runs = [[float(r["nDCG@10"]) for r in rows if r["key"] == key] for key, _ in keys]
    return bar_plot(path, [label for _, label in keys],
                    {"nDCG@10 (mean ± std over runs)": ([statistics.mean(v) for v in runs],
                                                         [statistics.stdev(v) if len(v) > 1 else 0.0 for v in runs])})


def comparisons(rows: list[dict], out: Path, have: set[str]) -> list[str]:
    """The issue's targets and the papers' claims as paired test differences with verdicts."""
    dev = {k: [float(r["dev_nDCG@10"]) for r in rows if r["key"] == k and r["dev_nDCG@10"] not in ("", None)]
           for k in have}
    mp = [k for k in MULTI_POSITIVE if dev.get(k)]  # folds (dbpedia) have no dev split: no pick
    best = max(mp, key=lambda k: statistics.mean(dev[k])) if mp else None
    pairs = [(best, "zero_shot", "best multi-positive loss (by dev) > zero-shot"),
             (best, "st_mnrl", "best multi-positive loss (by dev) > sentence-transformers MNRL"),
             (best, "single_lh", "paper 000: multi-positive (best by dev) >= SingleLH"),
             *[(k, "single_lh", "paper 000, each multi-positive loss >= SingleLH") for k in mp if k != best],
             ("wasserstein", "single_lh", "paper 002: Wasserstein on graded labels >= InfoNCE (SingleLH)"),
             ("label_weakening", "noisy_ce", "paper 004: label weakening >= CE at 30% noise"),
             ("sum_marg_lh_2ep", "zero_shot", "SumMargLH at the dev-best setting (2 epochs) > zero-shot"),
             ("sum_marg_lh_2ep", "st_mnrl_2ep", "SumMargLH > MNRL, both 2 epochs"),
             ("sum_marg_lh_g16_3ep", "zero_shot", "SumMargLH at the dev sweep's pick (G = 16, 3 epochs) > zero-shot"),
             ("sum_marg_lh_g16_3ep", "st_mnrl_3ep", "SumMargLH (dev sweep's pick) > MNRL, both 3 epochs"),
             *[(f"{k}_both", f"{k}_query", f"{k}: both towers vs query tower ({BOTH_QUERIES} queries)")
               for k in ("sum_marg_lh", "st_mnrl", "wasserstein", "label_weakening")]]
    lines = [f"Best multi-positive loss by mean dev nDCG@10: {best}.", "",
             "| comparison | Δ nDCG@10 [95% CI] | Δ R@100 [95% CI] | verdict (nDCG@10) |", "| --- | --- | --- | --- |"]
    for a, b, what in pairs:
        if a in have and b in have:
            (m, lo, hi), r100 = paired(out, rows, a, b), paired(out, rows, a, b, "R@100")
            lines.append(f"| {what} ({a} - {b}) | {m:+.4f} [{lo:+.4f}, {hi:+.4f}] | "
                         f"{r100[0]:+.4f} [{r100[1]:+.4f}, {r100[2]:+.4f}] | {verdict(lo, hi)} |")
    return lines


def save_best(rows: list[dict], args) -> str:
    """Retrain the run with the best dev nDCG@10 (any full-budget row, any seed), save it under
    OUT/best/ and score it on test through sentence-transformers' own encode (``st_check``)."""
    from gsdistill.retriever.st_check import sentence_transformers_metrics

    out = Path(args.out)
    full = {k for k, _, exp, extra in ROWS if exp is not None and not any("max_train_queries" in e for e in extra)}
    best = max((r for r in rows if r["key"] in full), key=lambda r: float(r["dev_nDCG@10"]))
    key, seed = best["key"], int(best["seed"])
    _, label, exp, extra = next(row for row in ROWS if row[0] == key)
    overrides = [f"negatives.cache_dir={out / 'mined_negatives'}", *args.set, *extra, f"train.seed={seed}",
                 f"noise.seed={seed}"]
    cfg = row_config(args.base, exp, overrides)
    cfg.eval.measures = MEASURES
    emb = corpus_embeddings(cfg, out)
    summary = train_and_evaluate(cfg, out / "best" / f"{key}-s{seed}", passage_embeddings=emb, progress=False,
                                 overwrite=True)  # this tool's own folder, retrained on every call
    t0 = time.perf_counter()
    theirs = sentence_transformers_metrics(summary["model_dir"], load_split(cfg)[2], MEASURES, k=cfg.eval.k)
    ours = summary["eval"]["metrics"]["nDCG@10"]
    text = (f"Best run by dev nDCG@10: {label}, seed {seed} (dev {float(best['dev_nDCG@10']):.4f}, test "
            f"{float(best['nDCG@10']):.4f} in the table). Retrained and saved to `{summary['model_dir']}`: test "
            f"nDCG@10 {ours:.4f} with gsdistill's evaluation, {theirs['nDCG@10']:.4f} through "
            f"`SentenceTransformer(path).encode_query` / `.encode_document` "
            f"(|difference| {abs(theirs['nDCG@10'] - ours):.1e}; goal <= 1e-3; R@100 {theirs['R@100']:.4f}; "
            f"sentence-transformers encoding took {time.perf_counter() - t0:.0f} s).")
    (out / "best.md").write_text(text + "\n")
    return text


def _mean_sd(runs: list[dict], m: str) -> str:
    vals = [float(r[m]) for r in runs if r.get(m) not in ("", None)]
    if not vals:
        return ""
    return f"{statistics.mean(vals):.4f}" + (f" ± {statistics.stdev(vals):.4f}" if len(vals) > 1 else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="nfcorpus_base", help="base experiment file laid over every row")
    p.add_argument("--out", default="runs/retriever_nfcorpus")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--both-seeds", type=int, nargs="+", default=[0], help="seeds of the both-tower rows (~5 min each)")
    p.add_argument("--set", nargs="*", default=[], help="extra key=value overrides for every row")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a crowded machine)")
    p.add_argument("--only", nargs="*", default=None, help="row keys to run (zero_shot for the baseline)")
    p.add_argument("--table-only", action="store_true", help="write the table from results.csv, run nothing")
    p.add_argument("--save-best", action="store_true",
                   help="then retrain the best run by dev, save it and check it through sentence-transformers")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = read_rows(Path(args.out) / "results.csv") if args.table_only else run_all(args)
    print(write_table(rows, Path(args.out)))
    if args.save_best:
        print(save_best(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
