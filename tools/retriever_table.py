"""Real-data table: every retriever loss on BEIR dbpedia (graded, multi-positive), over query folds
and seeds, plus zero-shot MiniLM and label weakening under injected noise.

    .venv/bin/python tools/retriever_table.py [--out runs/retriever_table] [--folds 4] [--seeds 0 1]

Each row is an experiment file of configs/retriever/. The frozen passage tower's corpus embeddings
are computed once and cached in OUT (keyed by encoder, max length and corpus size). Results go to
OUT/results.csv (one line per run; a rerun skips runs already there), OUT/table.md (mean and
sample standard deviation over folds x seeds) and OUT/table.png.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from gsdistill.config import load_config
from gsdistill.retrievers.evaluate import encode_corpus, evaluate_retriever
from gsdistill.retrievers.loading import load_retrieval_data, train_test_queries
from gsdistill.retrievers.pipeline import train_and_evaluate
from gsdistill.retrievers.train import build_model

ROWS = [("zero-shot MiniLM", None), ("SingleLH", "single_lh"), ("Rand1LH", "rand1_lh"), ("JointLH", "joint_lh"),
        ("SumMargLH", "sum_marg_lh"), ("LSEPair", "lse_pair"), ("BCE (DPR+)", "bce"),
        ("Wasserstein (graded)", "wasserstein"), ("SumMargLH then SingleLH (curriculum)", "curriculum"),
        ("SumMargLH, 30% noise", "noisy_sum_marg_lh"),
        ("Label weakening, 30% noise", "label_weakening")]
MEASURES = ["nDCG@10", "MRR@10", "R@20", "R@100", "Acc@20"]
FIELDS = ["row", "experiment", "fold", "seed", *MEASURES, "train_seconds", "first_loss", "last_loss", "noise_replaced"]


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
    return {(r["experiment"], int(r["fold"]), int(r["seed"])) for r in csv.DictReader(open(results))}


def run_all(args) -> list[dict]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [f"data.path={args.data}", f"data.folds={args.folds}", f"train.epochs={args.epochs}"]
    base = load_config("retriever", "dbpedia_base", common)
    emb = corpus_embeddings(base, out)
    results, done = out / "results.csv", done_runs(out / "results.csv")
    new_file = not results.is_file()
    with open(results, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new_file:
            writer.writeheader()
        for label, exp in ROWS:
            if args.only and (exp or "zero_shot") not in args.only:
                continue
            for fold in range(args.folds):
                for seed in ([0] if exp is None else args.seeds):
                    if ((exp or "zero_shot"), fold, seed) in done:
                        continue
                    row = one_run(label, exp, fold, seed, common, base, emb, out)
                    writer.writerow(row)
                    f.flush()
                    print(f"{label:28s} fold {fold} seed {seed}: nDCG@10 {row['nDCG@10']:.4f} "
                          f"({row['train_seconds']:.0f} s)", file=sys.stderr)
    return list(csv.DictReader(open(results)))


def one_run(label, exp, fold, seed, common, base, emb, out: Path) -> dict:
    overrides = [*common, f"data.fold={fold}", f"train.seed={seed}", f"noise.seed={seed}"]
    if exp is None:  # zero-shot: the untrained encoder on the held-out fold
        data = load_retrieval_data(base.data.format, base.data.path, None, base.data.split)
        _, test_q = train_test_queries(data, base.data.folds, fold, base.data.fold_seed)
        res = evaluate_retriever(build_model(base), data.subset(test_q), k=base.eval.k, measures=MEASURES,
                                 doc_emb=emb, progress=False)
        summary = {"eval": res, "train_seconds": 0.0, "first_loss": "", "last_loss": "", "noise": None}
    else:
        cfg = load_config("retriever", exp, overrides)
        summary = train_and_evaluate(cfg, out / "runs" / f"{exp}-f{fold}-s{seed}", passage_embeddings=emb,
                                     progress=False, save_model=False)
    m = summary["eval"]["metrics"]
    return {"row": label, "experiment": exp or "zero_shot", "fold": fold, "seed": seed,
            **{k: m[k] for k in MEASURES}, "train_seconds": summary["train_seconds"],
            "first_loss": summary["first_loss"], "last_loss": summary["last_loss"],
            "noise_replaced": (summary["noise"] or {}).get("replaced", "")}


def write_table(rows: list[dict], out: Path) -> str:
    """Mean ± sample std over runs, plus the paired gain over zero-shot on the same fold."""
    zero = {int(r["fold"]): float(r["nDCG@10"]) for r in rows if r["experiment"] == "zero_shot"}
    lines = ["| method | runs | " + " | ".join(MEASURES) + " | Δ nDCG@10 vs zero-shot (paired) |",
             "| --- | --- |" + " --- |" * (len(MEASURES) + 1)]
    means = {}
    for label, exp in ROWS:
        mine = [r for r in rows if r["experiment"] == (exp or "zero_shot")]
        if not mine:
            continue
        cells = []
        for m in MEASURES:
            vals = [float(r[m]) for r in mine]
            cells.append(f"{statistics.mean(vals):.4f} ± {_sd(vals):.4f}")
            means.setdefault(label, []).append(statistics.mean(vals))
        gains = [float(r["nDCG@10"]) - zero[int(r["fold"])] for r in mine if int(r["fold"]) in zero]
        cells.append(f"{statistics.mean(gains):+.4f} ± {_sd(gains):.4f}" if gains and exp else "")
        lines.append(f"| {label} | {len(mine)} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    plot_table(means, out / "table.png")
    return table


def _sd(vals: list[float]) -> float:
    return statistics.stdev(vals) if len(vals) > 1 else 0.0


def plot_table(means: dict[str, list[float]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = list(means)
    ax.barh(labels, [v[0] for v in means.values()])
    ax.set_xlabel("nDCG@10 (mean over folds x seeds)")
    lo = min(v[0] for v in means.values())
    ax.set_xlim(max(0.0, lo - 0.05), max(v[0] for v in means.values()) + 0.02)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "beir_dbpedia_subset"))
    p.add_argument("--out", default="runs/retriever_table")
    p.add_argument("--folds", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a crowded machine)")
    p.add_argument("--only", nargs="*", default=None, help="experiment names to run (zero_shot for the baseline)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = run_all(args)
    print(write_table(rows, Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
