"""``gsdistill eval``: crop-subsampled page retrieval and the document-level held-out split.

    gsdistill eval retrieval --model RUN_DIR [--model RUN_DIR2 ...] [--label NAME ...]
                             --pages SHARD_DIR [--config EXP.yaml] [--out DIR] [--overwrite] [key=value ...]
    gsdistill eval split SHARD_DIR --train-out DIR --eval-out DIR [--fraction 0.1] [--seed 0] [--overwrite]

``retrieval`` refuses pages whose documents are in a model's pretraining shards (checked against
the run's resolved config), or whose image or text is that of a pretraining page under another
document name (a renamed copy), unless ``--allow-overlap`` is given. ``split`` keeps documents that
share a page (a renamed copy) on one side. Output folders are checked against the inputs and each
other before anything is written, and locked against a second writer; an output holding another
output (an earlier evaluation, another split) or files gsdistill did not write is refused unless
``--overwrite``, which removes only what gsdistill wrote there.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gsdistill.eval.model_folder import check_pretraining_folder
from gsdistill.pretrain.run_folder import pretrain_source, run_config


def _retrieval(args: argparse.Namespace) -> int:
    from gsdistill.config import load_config
    from gsdistill.output_folder import lock_folder
    from gsdistill.tuples.store.folder import removed_if_left_empty
    cfg = load_config("eval", args.config, args.overrides)
    from gsdistill.threads import apply_threads
    apply_threads(cfg.threads)
    labels = args.label or [Path(m).name for m in args.model]
    if len(labels) != len(args.model):
        raise SystemExit(f"gsdistill eval retrieval: {len(args.model)} --model but {len(labels)} --label")
    pages_dir = Path(args.pages)
    if not pages_dir.exists():
        print(f"gsdistill eval retrieval: pages folder not found: {pages_dir}", file=sys.stderr)
        return 2
    out_dir = _checked_out(Path(args.out or cfg.out_dir), pages_dir, args.model, args.config, args.text_cache)
    with removed_if_left_empty(out_dir), lock_folder(out_dir):
        _claim_report(out_dir, args.overwrite)
        return _retrieval_into(out_dir, args, cfg, labels, pages_dir)


# what eval retrieval writes into --out (write_report, save_config, the text cache by default)
REPORT = ("results.json", "metrics.csv", "table.md", "acc_vs_k.png")


def _layout():
    from gsdistill.output_manifest import Layout
    return Layout("eval retrieval", REPORT + ("config.yaml", "text_cache"),
                  REPORT + ("config.yaml", "text_cache/*.safetensors", "text_cache/*.tmp"), REPORT,
                  (("results.json", "table.md"), ("results.json", "metrics.csv")))


def _checked_out(out_dir: Path, pages_dir: Path, models: list[str], config: str | None = None,
                 text_cache: str | None = None) -> Path:
    """``--out`` checked before any model or page is read: a folder, not the pages, a model run
    (whose config.yaml it would overwrite) or the experiment file, nor holding them; a folder inside a
    run is fine."""
    from gsdistill.config import experiment_files
    from gsdistill.output_folder import check_output_dir
    inside = [m for m in models if Path(m).resolve() in out_dir.resolve().parents]
    return check_output_dir(out_dir, "--out", inputs=[("--pages", pages_dir)] +
                            [("--model", m) for m in models if m not in inside] +
                            [("--config", f) for f in experiment_files("eval", config)])


def _claim_report(out_dir: Path, overwrite: bool) -> None:
    """``--out`` holding an earlier evaluation (its results, metrics, table or plot) or files gsdistill
    did not write is refused unless ``overwrite``, which removes the earlier report (what gsdistill
    wrote there; the text cache stays, it is keyed by text) and nothing else, once the new report is
    ready (:func:`_replace_report`)."""
    from gsdistill.output_folder import OutputConflict, check_claim
    from gsdistill.output_removal import describe
    layout = _layout()
    inv = check_claim(out_dir, "--out", layout, overwrite, fresh=False)
    held = inv.ours_matching(layout)
    if held and not overwrite:
        raise OutputConflict(f"--out {out_dir}: holds an earlier evaluation ({describe(held)}); give another --out, "
                             "or pass --overwrite to replace it (only what gsdistill wrote there is removed)")
    check_claim(out_dir, "--out", layout, overwrite)


def _replace_report(out_dir: Path, overwrite: bool) -> None:
    """``--overwrite``: the earlier report goes only now, once every check has passed and the new one is
    ready to be written (a refused evaluation leaves the earlier one as it was)."""
    from gsdistill.output_folder import remove_earlier
    if overwrite:
        remove_earlier(out_dir, _layout(), under=[*REPORT, "config.yaml"])


def _retrieval_into(out_dir: Path, args: argparse.Namespace, cfg, labels: list[str], pages_dir: Path) -> int:
    from gsdistill.config import load_config, save_config
    from gsdistill.tuples.store.reader import ShardDataset
    from gsdistill.eval import splits
    from gsdistill.eval.page_report import write_report
    from gsdistill.models.text_encoder import TextEncoder
    from gsdistill.device import resolve_device
    from gsdistill.eval.page_retrieval import CachedTextEncoder, evaluate_page_retrieval
    from gsdistill.pretrain.checkpoint import load_pretrained
    eval_index = splits.content_index(pages_dir) if not args.allow_overlap else (set(), {})
    results, encoders = {}, {}
    for label, model_dir in zip(labels, map(Path, args.model)):
        run_cfg = run_config(model_dir)
        check_pretraining_folder(model_dir, run_cfg)
        if not args.allow_overlap:
            train_shards, origin = pretrain_source(model_dir, run_cfg)
            if train_shards is not None:
                splits.check_held_out_pages(eval_index, train_shards,
                                            f"{pages_dir} vs the pretraining data of {model_dir} ({origin})")
        model_cfg = cfg
        if cfg.retrieval.image_size is None:  # the run's view size, through the loader as any setting
            size = int((run_cfg.get("views") or {}).get("global_size") or 224)
            model_cfg = load_config("eval", args.config, [*args.overrides, f"retrieval.image_size={size}"])
        print(f"[eval] {label}: {model_dir} on {pages_dir}", file=sys.stderr)
        model = load_pretrained(model_dir)
        name = getattr(model, "text_encoder_name", None)
        if name not in encoders:  # one cached encoder per encoder name, shared by the models and runs
            encoder = TextEncoder(name, device=resolve_device(cfg.retrieval.device))
            file = f"{Path(str(getattr(encoder, 'name', None) or type(encoder).__name__)).name}.safetensors"
            encoders[name] = CachedTextEncoder(encoder, Path(args.text_cache or out_dir / "text_cache") / file)
        results[label] = evaluate_page_retrieval(model, ShardDataset(pages_dir), encoders[name], model_cfg)
        encoders[name].save()
        results[label]["model_dir"] = str(model_dir)
    _replace_report(out_dir, args.overwrite)
    save_config(cfg, out_dir)
    paths = write_report(results, out_dir)
    print(paths["table"].read_text())
    print(f"[eval] wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def _split(args: argparse.Namespace) -> int:
    from gsdistill.eval.splits import split_shards
    record = split_shards(args.shards, args.train_out, args.eval_out, args.fraction, args.seed,
                          args.pages_per_shard, overwrite=args.overwrite)
    print(json.dumps({k: v for k, v in record.items() if not k.endswith("_docs") and k != "grouped"}, indent=2))
    print(f"[split] {len(record['train_docs'])} pretraining / {len(record['eval_docs'])} held-out documents",
          file=sys.stderr)
    if record["grouped"]:
        listed = "; ".join(" = ".join(g) for g in record["grouped"][:3])
        more = f" and {len(record['grouped']) - 3} more" if len(record["grouped"]) > 3 else ""
        print(f"[split] kept {len(record['grouped'])} group(s) of documents with identical pages on one side "
              f"({listed}{more}; split.json 'grouped')", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gsdistill eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("retrieval", help="crop-subsampled page retrieval (paper 003 Table 2)")
    r.add_argument("--model", action="append", required=True, help="pretraining run or checkpoint dir (repeatable)")
    r.add_argument("--label", action="append", help="name of each --model in the tables (default: dir name)")
    r.add_argument("--pages", required=True, help="shard folder of held-out pages")
    r.add_argument("--config", help="experiment file over configs/eval/default.yaml")
    r.add_argument("--out", help="output folder (default: the config's out_dir)")
    r.add_argument("--text-cache", help="folder of text-encoder caches reused across runs (default: OUT/text_cache)")
    r.add_argument("--allow-overlap", action="store_true",
                   help="skip the check that no page document was in the pretraining data")
    r.add_argument("--overwrite", action="store_true",
                   help="--out holds an earlier evaluation or files gsdistill did not write: remove the earlier "
                        "report (what gsdistill wrote there, by its record; never another file), then evaluate")
    r.add_argument("overrides", nargs="*", help="key=value overrides, e.g. retrieval.n_gallery=500")
    r.set_defaults(func=_retrieval)
    s = sub.add_parser("split", help="split a shard folder by document into pretraining / held-out")
    s.add_argument("shards", help="input shard folder")
    s.add_argument("--train-out", required=True)
    s.add_argument("--eval-out", required=True)
    s.add_argument("--fraction", type=float, default=0.1, help="share of documents held out")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--pages-per-shard", type=int, default=256)
    s.add_argument("--overwrite", action="store_true",
                   help="an output folder holds another output: remove the files gsdistill wrote there (shards, "
                        "manifest, split.json, units/, embeddings/, ...; never other files) first")
    s.set_defaults(func=_split)
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"gsdistill eval {args.command}: {e}", file=sys.stderr)
        return 2
