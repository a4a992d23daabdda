"""``gsdistill tuples``: build page-tuple shards, embed their texts, summarise a shard dir.

    gsdistill tuples build --from {pdf,images,coco,docbank,synthetic} INPUT --out DIR
                           [--config FILE] [--dpi N] [--pages-per-shard N] [--max-pages N]
                           [--limit N] [--no-ocr] [--image-format png|jpg] [--workers N]
                           [--engine local|ray] [--ray-address ADDR] [--overwrite] [key=value ...]
    gsdistill tuples embed SHARD_DIR [--encoder NAME] [--batch-size N] [--workers N] [--force] [key=value ...]
    gsdistill tuples info SHARD_DIR

Settings come from ``configs/tuples/default.yaml`` <- ``--config`` <- ``key=value`` <- flags.
The resolved config is saved as ``DIR/config.yaml``; skipped inputs go to the manifest and
``DIR/skipped.csv``. ``build`` started again with the same command resumes: finished shards are
verified and kept (``gsdistill.tuples.builder.driver``); a ``--out`` holding another output is refused
unless ``--overwrite``. ``build`` and ``embed`` hold their folder's lock: a second writer gets one
line naming the first one's PID.

``embed`` runs the text encoder (``gsdistill.models``, a layer above the data): its handler lives in
:mod:`gsdistill.embed.cli`, which is what ``gsdistill tuples`` runs; this module parses all three.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gsdistill.errors import GsdistillError, InputError
from gsdistill.tuples.errors import DataError

# flag -> config key it sets
_FLAG_KEYS = {"dpi": "pdf.dpi", "pages_per_shard": "build.pages_per_shard", "max_pages": "build.max_pages",
              "limit": "build.limit", "image_format": "build.image_format", "encoder": "embed.encoder",
              "batch_size": "embed.batch_size", "workers": "build.workers", "engine": "build.engine",
              "ray_address": "build.ray_address", "embed_workers": "embed.workers"}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gsdistill tuples", description="page-tuple shards: build, embed, info",
                                 epilog="build and embed also take key=value config overrides anywhere on the line")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build shards from PDFs, images (OCR), COCO, DocBank or synthetic pages",
                       epilog="key=value overrides of configs/tuples/default.yaml may follow, e.g. pdf.max_page_count=500")
    b.add_argument("--from", dest="kind", required=True, choices=["pdf", "images", "coco", "docbank", "synthetic"])
    b.add_argument("input", help="file or folder (synthetic: number of pages)")
    b.add_argument("--out", required=True, help="output shard folder")
    b.add_argument("--config", default=None, help="experiment YAML over configs/tuples/default.yaml")
    b.add_argument("--dpi", type=int, help="PDF render resolution (pdf.dpi)")
    b.add_argument("--pages-per-shard", type=int, help="pages per tar shard (build.pages_per_shard)")
    b.add_argument("--max-pages", type=int, help="stop after this many pages in all")
    b.add_argument("--limit", type=int, help="use only the first N input files")
    b.add_argument("--image-format", choices=["zst", "png", "jpg"])
    b.add_argument("--no-ocr", action="store_true", help="never run Tesseract (ocr.enabled=false)")
    b.add_argument("--workers", type=int, help="shards built at once, >= 1 (build.workers; default: the cores it may use)")
    b.add_argument("--engine", choices=["local", "ray"], help="local process pool or Ray tasks (build.engine)")
    b.add_argument("--ray-address", help="engine ray: address of a running Ray cluster (build.ray_address)")
    b.add_argument("--overwrite", action="store_true",
                   help="--out holds another output (other shards, a split) or files gsdistill did not "
                        "write: remove what gsdistill wrote there (by its record: shards, manifest, units/, "
                        "embeddings/, ...; never another file, never through a link), then build")
    e = sub.add_parser("embed", help="cache text-encoder embeddings of spans and box descriptors",
                       epilog="key=value overrides may follow, e.g. embed.max_spans=32 embed.device=cuda")
    e.add_argument("shard_dir")
    e.add_argument("--config", default=None)
    e.add_argument("--encoder", default=None, help="Hugging Face name/path (default all-MiniLM-L6-v2)")
    e.add_argument("--batch-size", type=int)
    e.add_argument("--workers", dest="embed_workers", type=int,
                   help="CPU encoder processes (>= 1), each with cores/N torch threads (embed.workers)")
    e.add_argument("--force", action="store_true", help="rebuild even when the cache is current")
    i = sub.add_parser("info", help="summarise a shard folder (pages, classes, skips, cache)")
    i.add_argument("shard_dir")
    return ap


def _config(args):
    from gsdistill.config import load_config
    overrides = list(args.overrides)
    for flag, key in _FLAG_KEYS.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    if getattr(args, "no_ocr", False):
        overrides.append("ocr.enabled=false")
    cfg = load_config("tuples", args.config, overrides)
    from gsdistill.threads import apply_threads
    apply_threads(cfg.threads, torch_too=args.cmd != "build")
    return cfg


def class_table(manifest: dict) -> list[str]:
    """Rows "class  boxes  pages-with-class  share-of-pages" for every class present."""
    pages = max(manifest["pages"], 1)
    rows = [f"{'class':<16}{'boxes':>8}{'pages':>8}{'share':>8}"]
    for name in sorted(manifest["boxes_per_class"]):
        with_ = manifest["pages_with_class"].get(name, 0)
        rows.append(f"{name:<16}{manifest['boxes_per_class'][name]:>8}{with_:>8}{with_ / pages:>8.1%}")
    return rows


def _build(args) -> int:
    from gsdistill.config import experiment_files
    from gsdistill.tuples.builder.driver import build_shards
    cfg = _config(args)
    out = Path(args.out)
    t0 = time.time()
    manifest = build_shards(args.kind, args.input, out, cfg, overwrite=args.overwrite, save_config=True,
                            config_files=experiment_files("tuples", args.config))
    dt = time.time() - t0
    print(f"{manifest['pages']} pages ({manifest['documents']} documents) in {len(manifest['shards'])} shards -> {out} "
          f"[{dt:.1f} s, {manifest['pages'] / max(dt, 1e-9):.2f} pages/s]")
    print("\n".join(class_table(manifest)))
    if manifest["skipped_count"]:
        print(f"skipped {manifest['skipped_count']} inputs (see {out / 'skipped.csv'}): {manifest['skip_reasons']}")
    if not manifest["pages"]:  # nothing to train on is a data error, said in one line
        raise DataError(f"{args.input}: no page could be built; {manifest['skipped_count']} inputs skipped "
                        f"{manifest['skip_reasons']} (see {out / 'skipped.csv'})")
    return 0


def _info(args) -> int:
    from gsdistill.tuples.store.reader import read_manifest
    from gsdistill.tuples.store.text_cache import cached_fields, read_meta
    folder = Path(args.shard_dir)
    m = read_manifest(folder)
    print(f"{folder}: {m['pages']} pages, {m['documents']} documents, {m['spans']} spans, "
          f"{len(m['shards'])} shards, sources {m['sources']}")
    print("\n".join(class_table(m)))
    print(f"skipped: {m['skipped_count']} {m['skip_reasons']}")
    meta = read_meta(folder)
    print("embeddings: " + (f"{meta['encoder']} ({meta.get('precision', 'fp32')}) dim {meta['dim']} descriptors "
                            f"{meta['descriptor_version']} fields {', '.join(cached_fields(meta))}"
                            f"{_cache_state(folder, m, meta)}" if meta else "none"))
    return 0


def _cache_state(folder: Path, manifest: dict, meta: dict) -> str:
    """", current" when the cache was made for the shards the folder holds now (each shard's content
    digest, what the reader compares), else what is stale and the command that redoes it."""
    from gsdistill.tuples.store.reader import shard_digest
    from gsdistill.tuples.store.text_cache import FORMAT
    redo = f"; run 'gsdistill tuples embed {folder}'"
    if meta.get("format") != FORMAT or not isinstance(meta.get("shards"), dict):
        return f"; STALE: made in an older cache format{redo}"
    cached = meta["shards"]
    names = [s["name"] for s in manifest["shards"]]
    missing = [n for n in names if n not in cached]
    changed = [n for n in names if n in cached and cached[n] != shard_digest(folder / n)]
    parts = [f"{len(changed)} of {len(names)} shards changed since they were embedded (a rebuild)"] if changed else []
    parts += [f"{len(missing)} of {len(names)} shards not embedded"] if missing else []
    return f"; STALE: {' and '.join(parts)}{redo}" if parts else ", current"


def _needs_encoder(args) -> int:
    raise InputError("tuples embed runs the text encoder, which this data package does not import: run "
                     "'gsdistill tuples embed' (gsdistill.embed.cli.main)")


def main(argv: list[str] | None = None, embed=None) -> int:
    """``build`` and ``info`` here; ``embed`` by the handler :mod:`gsdistill.embed.cli` hands in (it
    imports the text encoder, which lies above this package)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # key=value overrides may sit anywhere among the flags; argparse cannot interleave them with
    # sub-command positionals, so they are taken out first
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = _parser().parse_args([a for a in argv if a not in overrides])
    args.overrides = overrides
    from gsdistill.config import ConfigError
    try:
        return {"build": _build, "embed": embed or _needs_encoder, "info": _info}[args.cmd](args)
    except GsdistillError as e:  # bad input or config: one line naming the file or key, exit code 2 as every stage
        kind = "config error" if isinstance(e, ConfigError) else "error"
        print(f"gsdistill tuples {args.cmd}: {kind}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
