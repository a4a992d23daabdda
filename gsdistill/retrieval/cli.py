"""``gsdistill eval``: crop-subsampled page retrieval and the document-level held-out split.

    gsdistill eval retrieval --model RUN_DIR [--model RUN_DIR2 ...] [--label NAME ...]
                             --pages SHARD_DIR [--config EXP.yaml] [--out DIR] [key=value ...]
    gsdistill eval split SHARD_DIR --train-out DIR --eval-out DIR [--fraction 0.1] [--seed 0]

``retrieval`` refuses pages whose documents are in a model's pretraining shards (checked against
the run's resolved config) unless ``--allow-overlap`` is given.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from gsdistill.errors import MissingFileError


def run_root(model_dir: Path) -> Path:
    """The pretraining run folder of ``--model``: a run dir, its ``checkpoints/`` dir or one
    ``checkpoints/step-N`` folder all lead to the run (where its synthetic ``data/`` lives)."""
    model_dir = Path(model_dir)
    if model_dir.name == "checkpoints":
        return model_dir.parent
    if model_dir.parent.name == "checkpoints":
        return model_dir.parent.parent
    return model_dir


def _config_file(model_dir: Path) -> Path | None:
    for cand in (Path(model_dir) / "config.yaml", run_root(model_dir) / "config.yaml"):
        if cand.is_file():
            return cand
    return None


def run_config(run_dir: Path) -> dict:
    """The resolved pretraining config saved in a run (or checkpoint) dir; {} when there is none."""
    path = _config_file(Path(run_dir))
    return (yaml.safe_load(path.read_text()) or {}) if path is not None else {}


def pretrain_source(model_dir: Path, cfg: dict) -> tuple[Path | None, str]:
    """``(shard folder the run was pretrained on, where that path came from)``: ``data.shards`` of
    its saved config (a relative one resolved against the run folder, else the working directory),
    else the synthetic pages in ``RUN/data``. A configured folder that cannot be found is an error:
    the held-out check must not be skipped silently."""
    root = run_root(Path(model_dir))
    origin = _config_file(Path(model_dir)) or root / "config.yaml"
    shards = (cfg.get("data") or {}).get("shards")
    if shards:
        given = Path(str(shards))
        for cand, how in ((given, "absolute") if given.is_absolute() else (root / given, "relative to the run"),
                          (given, "relative to the working directory")):
            if cand.is_dir():
                return cand, f"data.shards={shards!r} of {origin}, {how}"
        raise MissingFileError(f"data.shards={shards!r} of {origin}: not found (tried {root / given} and "
                               f"{given.resolve()}); the held-out check needs the pretraining pages "
                               "(--allow-overlap skips it)")
    synthetic = root / "data"
    if synthetic.is_dir():
        return synthetic, f"the synthetic pretraining pages of run {root}"
    return None, f"no pretraining data recorded for {root}"


def pretrain_shards(run_dir: Path, cfg: dict) -> Path | None:
    """Shard folder a run was pretrained on (``data.shards``, else the synthetic ``RUN_DIR/data``)."""
    return pretrain_source(run_dir, cfg)[0]


def _retrieval(args: argparse.Namespace) -> int:
    from gsdistill.config import load_config, save_config
    from gsdistill.data.shards import ShardDataset
    from gsdistill.retrieval import splits
    from gsdistill.retrieval.page_report import write_report
    from gsdistill.models.text_encoder import TextEncoder
    from gsdistill.retrieval.page_retrieval import CachedTextEncoder, evaluate_page_retrieval, resolve_device
    from gsdistill.train.checkpoint import load_pretrained

    cfg = load_config("eval", args.config, args.overrides)
    labels = args.label or [Path(m).name for m in args.model]
    if len(labels) != len(args.model):
        raise SystemExit(f"gsdistill eval retrieval: {len(args.model)} --model but {len(labels)} --label")
    pages_dir = Path(args.pages)
    if not pages_dir.exists():
        print(f"gsdistill eval retrieval: pages folder not found: {pages_dir}", file=sys.stderr)
        return 2
    eval_docs = splits.document_ids(pages_dir) if not args.allow_overlap else set()
    out_dir = Path(args.out or cfg.out_dir)
    results, encoders = {}, {}
    for label, model_dir in zip(labels, map(Path, args.model)):
        run_cfg = run_config(model_dir)
        if not args.allow_overlap:
            train_shards, origin = pretrain_source(model_dir, run_cfg)
            if train_shards is not None:
                splits.check_held_out(eval_docs, splits.document_ids(train_shards),
                                      f"{pages_dir} vs the pretraining data of {model_dir} ({origin})")
        model_cfg = cfg.copy()
        if model_cfg.retrieval.image_size is None:
            model_cfg.retrieval.image_size = int((run_cfg.get("views") or {}).get("global_size") or 224)
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
    save_config(cfg, out_dir)
    paths = write_report(results, out_dir)
    print(paths["table"].read_text())
    print(f"[eval] wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def _split(args: argparse.Namespace) -> int:
    from gsdistill.retrieval.splits import split_shards
    record = split_shards(args.shards, args.train_out, args.eval_out, args.fraction, args.seed,
                          args.pages_per_shard)
    print(json.dumps({k: v for k, v in record.items() if not k.endswith("_docs")}, indent=2))
    print(f"[split] {len(record['train_docs'])} pretraining / {len(record['eval_docs'])} held-out documents",
          file=sys.stderr)
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
    r.add_argument("overrides", nargs="*", help="key=value overrides, e.g. retrieval.n_gallery=500")
    r.set_defaults(func=_retrieval)
    s = sub.add_parser("split", help="split a shard folder by document into pretraining / held-out")
    s.add_argument("shards", help="input shard folder")
    s.add_argument("--train-out", required=True)
    s.add_argument("--eval-out", required=True)
    s.add_argument("--fraction", type=float, default=0.1, help="share of documents held out")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--pages-per-shard", type=int, default=256)
    s.set_defaults(func=_split)
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"gsdistill eval {args.command}: {e}", file=sys.stderr)
        return 2
