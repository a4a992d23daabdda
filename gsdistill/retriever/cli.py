"""``gsdistill retriever {train,eval}``: text dense retrievers on BEIR / Tevatron / DPR data.

  gsdistill retriever train [--config EXP] [--overwrite] [key=value ...]
  gsdistill retriever eval  [--model DIR] [--config EXP] [--out DIR] [--overwrite] [key=value ...]

``eval`` without ``--model`` evaluates the untrained base encoder of ``model.encoder`` (zero-shot).
Queries evaluated: the held-out fold when ``data.folds >= 2``, ``data.eval_path`` when given,
else every judged query of ``data.path``. ``eval`` writes to ``--out`` (default
``<run.dir>/eval/<parent>-<model folder>``), never into the model folder. Both commands print the data
loader's summary (and write it as data_summary.json) and honour ``threads`` and ``train.device``.
``train`` exits 1 when training diverged and 130 when it was stopped by a signal (a checkpoint is
written; continue with ``train.resume``, which takes the run's own config, the overrides on top).
A run folder (``run.dir/run.name``) or ``--out`` holding an earlier result is refused (exit 2) unless
``--overwrite``, which removes what a run or evaluation writes there and nothing else; a folder being
written by another process is refused with its PID.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gsdistill.config import load_config, save_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gsdistill retriever", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train a dual encoder with any loss of the core")
    ev = sub.add_parser("eval", help="encode the corpus, search, write metrics and a TREC run file")
    ev.add_argument("--model", default=None, help="saved model dir (default: zero-shot base encoder)")
    ev.add_argument("--out", default=None,
                    help="output dir (default: <run.dir>/eval/<parent>-<model folder> or <run.dir>/zero-shot)")
    tr.add_argument("--overwrite", action="store_true",
                    help="start afresh in a run folder that holds an earlier run: removes what a run writes "
                         "there (model/, checkpoints/, metrics.csv, tb/, plots/, eval/, config.yaml, history.jsonl, "
                         "summary.json, data_summary.json), never other files")
    ev.add_argument("--overwrite", action="store_true",
                    help="replace an earlier evaluation in --out (run.trec, metrics.json, per_query.json, "
                         "config.yaml, data_summary.json); other files stay")
    for s in (tr, ev):
        s.add_argument("--config", default=None, help="experiment file or name in configs/retriever/")
        s.add_argument("overrides", nargs="*", help="key=value config overrides")
    return p


def _parse(argv: list[str]) -> argparse.Namespace:
    """Options may come between the key=value overrides (``train a=1 --overwrite b=2``)."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    unknown = [a for a in rest if "=" not in a or a.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = [*args.overrides, *rest]
    return args


def _eval(args, cfg) -> int:
    from gsdistill.retriever.run_folder import claim_eval_folder, input_paths

    if args.model and not Path(args.model).is_dir():
        raise ValueError(f"--model {args.model}: no such folder")
    resolved = Path(args.model).resolve() if args.model else None  # <run>/model -> eval/<run>-model
    default_out = (Path(cfg.run.dir) / "eval" / f"{resolved.parent.name}-{resolved.name}" if resolved else
                   Path(cfg.run.dir) / "zero-shot")
    out = Path(args.out) if args.out else default_out
    if args.model and Path(args.model).resolve() in (out.resolve(), *out.resolve().parents):
        raise ValueError(f"--out {out} lies inside the model folder {args.model}; eval never writes there")
    with claim_eval_folder(out, args.overwrite, input_paths(cfg, args.model, args.config)):
        return _evaluate_into(args, cfg, out)


def _evaluate_into(args, cfg, out: Path) -> int:
    from gsdistill.retriever.evaluate import evaluate_retriever
    from gsdistill.retriever.model import DualEncoder
    from gsdistill.retriever.pipeline import load_split, report_data
    from gsdistill.device import resolve_device
    from gsdistill.retriever.train import build_model

    loaded, train_data, eval_data = load_split(cfg)
    data = eval_data if eval_data is not None else train_data
    report_data({"loaded": loaded, "eval": data}, out)
    model = DualEncoder.from_pretrained(args.model) if args.model else build_model(cfg)
    model = model.to(resolve_device(cfg.train.device))
    save_config(cfg, out)
    result = evaluate_retriever(model, data, k=cfg.eval.k, measures=list(cfg.eval.measures),
                                batch_size=cfg.eval.batch_size, use_faiss=cfg.eval.use_faiss, out_dir=out,
                                tag=Path(args.model).name if args.model else "zero-shot",
                                min_relevance=cfg.eval.min_relevance)
    print(json.dumps(result, indent=2))
    print(f"run file: {out / 'run.trec'}")
    return 0


def main(argv: list[str]) -> int:
    args = _parse(argv)
    from gsdistill.retriever.resume import resume_config
    cfg = (resume_config(args.config, args.overrides) if args.command == "train"  # on resume: the run's own config
           else load_config("retriever", args.config, args.overrides))
    from gsdistill.threads import apply_threads
    apply_threads(cfg.threads)  # before any torch work
    from gsdistill.errors import TrainingDiverged, TrainingInterrupted, run_training_command
    prog = f"gsdistill retriever {args.command}"

    def run() -> int:
        try:
            if args.command == "eval":
                return _eval(args, cfg)
            from gsdistill.retriever.pipeline import train_and_evaluate
            print(json.dumps(train_and_evaluate(cfg, overwrite=args.overwrite, config=args.config), indent=2))
            return 0
        except (TrainingDiverged, TrainingInterrupted):
            raise  # run_training_command's exit codes
        except (ValueError, RuntimeError) as e:  # bad data / config: one clear line, no traceback
            print(f"{prog}: {e}", file=sys.stderr)
            return 2
    return run_training_command(prog, run)
