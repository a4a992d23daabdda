"""Dev-only search for the NFCorpus table's "dev sweep" row: SumMargLH settings scored by dev nDCG@10 per epoch.

    OMP_NUM_THREADS=1 .venv/bin/python tools/experiments/retriever_dev_sweep.py [--out runs/retriever_nfcorpus] [--seed 0]
        [--only NAME ...] [--set key=value ...]

Each setting is SumMargLH with the base file (``--base``, as in tools/experiments/retriever_table.py) and its own overrides,
trained once (seed 0) on the train split; after every epoch the model is scored on the dev split only. The
setting with the best dev score of any epoch is the one tools/experiments/retriever_table.py runs as its dev-sweep row
(``sum_marg_lh_g16_3ep``), over its seeds, and reports on test. Test scores are computed by the training
pipeline but neither printed nor written here: nothing in the choice looks at them. Writes OUT/dev_sweep.csv
(one line per setting; a rerun skips settings already there) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import retriever_table as table  # noqa: E402  (row_config, corpus_embeddings: the table's own set-up)

from gsdistill.retriever.pipeline import train_and_evaluate  # noqa: E402
from gsdistill.run_log import append_row, read_rows  # noqa: E402

SETTINGS = {  # name -> overrides of SumMargLH on top of the base file (lr 1e-4, 1 epoch, G = 8, M = 4)
    "1 epoch, lr 3e-5": ["train.lr=3e-5"],
    "1 epoch, lr 1e-4": [],
    "1 epoch, lr 3e-4": ["train.lr=3e-4"],
    "2 epochs, lr 1e-4": ["train.epochs=2"],
    "4 epochs, lr 1e-4": ["train.epochs=4"],
    "4 epochs, lr 5e-5": ["train.epochs=4", "train.lr=5e-5"],
    "2 epochs, lr 1e-4, skip the top 10 BM25 hits": ["train.epochs=2", "negatives.skip_top=10"],
    "3 epochs, lr 1e-4, G = 16": ["train.epochs=3", "groups.size=16"],
}
FIELDS = ["setting", "seed", "dev_by_epoch", "best_epoch", "best_dev", "train_seconds"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="nfcorpus_base")
    p.add_argument("--out", default="runs/retriever_nfcorpus", help="the table's folder (corpus and negative caches)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", nargs="*", default=None, help="setting names to run")
    p.add_argument("--set", nargs="*", default=[], help="extra key=value overrides for every setting")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [f"negatives.cache_dir={out / 'mined_negatives'}", f"train.seed={args.seed}", *args.set]
    emb = table.corpus_embeddings(table.row_config(args.base, None, common), out)
    csv = out / "dev_sweep.csv"
    done = {(r["setting"], int(r["seed"])) for r in (read_rows(csv) if csv.is_file() else [])}
    for name, overrides in SETTINGS.items():
        if (args.only and name not in args.only) or (name, args.seed) in done:
            continue
        cfg = table.row_config(args.base, "sum_marg_lh", [*common, *overrides])
        if not cfg.data.dev_split:
            raise SystemExit(f"{args.base}: data.dev_split is not set; a dev sweep needs a dev split")
        slug = "".join(c if c.isalnum() else "_" for c in name)
        s = train_and_evaluate(cfg, out / "dev_sweep" / f"{slug}-s{args.seed}", passage_embeddings=emb,
                               progress=False, save_model=False, overwrite=True)  # a row missing from the CSV: redo its folder
        dev, best = s["selection"]["dev_scores"], s["selection"]["best_epoch"]
        append_row(csv, {"setting": name, "seed": args.seed, "dev_by_epoch": json.dumps([round(d, 4) for d in dev]),
                         "best_epoch": best + 1, "best_dev": dev[best], "train_seconds": s["train_seconds"]}, FIELDS)
        print(f"{name}: dev nDCG@10 by epoch {[round(d, 4) for d in dev]}", file=sys.stderr, flush=True)
    rows = read_rows(csv)
    print("| setting (SumMargLH) | seed | dev nDCG@10 after each epoch | best epoch | best dev |\n| --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: -float(r["best_dev"])):
        print(f"| {r['setting']} | {r['seed']} | {', '.join(f'{d:.4f}' for d in json.loads(r['dev_by_epoch']))} | "
              f"{r['best_epoch']} | {float(r['best_dev']):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
