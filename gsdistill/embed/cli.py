"""``gsdistill tuples``: the page-tuple command, with the text encoder handed in for ``embed``.

:mod:`gsdistill.tuples.cli` parses the command and runs ``build`` and ``info``; the data layer never
imports ``gsdistill.models``, so ``embed`` (which runs ``gsdistill.models.text_encoder``) is handled
here, one layer above the model, and handed to it. The stage itself is
:func:`gsdistill.tuples.embedding.stage.embed_shards` (shards -> texts -> encoder -> cache).
"""
from __future__ import annotations

from pathlib import Path

from gsdistill.errors import InputError


def check_encoder(name: str) -> None:
    """One line, before any shard is read, for an encoder that cannot load: a folder that is not a
    saved Hugging Face model (no config.json), a path that does not exist, or a name that is neither
    a local folder nor in the offline Hugging Face cache (nothing is downloaded)."""
    from gsdistill.models.text_encoder import resolve_encoder
    try:
        path = Path(resolve_encoder(name)).expanduser()
    except RuntimeError as e:  # the default encoder's package is missing
        raise InputError(f"--encoder {name}: {e}") from None
    if path.is_dir():
        if not (path / "config.json").is_file():
            held = sorted(p.name for p in path.iterdir())
            listed = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "") or "nothing"
            raise InputError(f"--encoder {name}: folder without config.json (it holds {listed}): not a saved "
                             "Hugging Face model; give a model folder (config.json, tokenizer, weights) or a "
                             "model name")
        return
    if path.exists():
        raise InputError(f"--encoder {name}: a file, not a model folder; give a folder with config.json or a "
                         "model name")
    looks_like_path = str(name).startswith((".", "/", "~")) or str(name).count("/") > 1
    if not looks_like_path:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE
        try:
            cached = try_to_load_from_cache(str(name), "config.json")
        except Exception:  # an invalid repo id: not in any cache
            cached = None
        if isinstance(cached, str):
            return
        raise InputError(f"--encoder {name}: not a local folder and not in the offline Hugging Face cache "
                         f"({HF_HUB_CACHE}); give a model folder, or download it once "
                         f"(huggingface-cli download {name})")
    raise InputError(f"--encoder {name}: no such folder; give a model folder (config.json, tokenizer, weights)")


def embed(args) -> int:
    """``gsdistill tuples embed``: the shards' texts through the text encoder into their cache."""
    from gsdistill.models.text_encoder import DEFAULT_ENCODER, TextEncoder
    from gsdistill.output_folder import lock_folder
    from gsdistill.tuples.cli import _config
    from gsdistill.tuples.embedding.stage import embed_shards
    from gsdistill.tuples.store.reader import read_manifest
    from gsdistill.tuples.store.text_cache import fields_for
    cfg = _config(args)
    e = cfg.embed
    name = e.encoder or DEFAULT_ENCODER
    check_encoder(name)
    read_manifest(args.shard_dir)  # a shard folder, before the lock would create a missing one
    with lock_folder(args.shard_dir):  # one writer of embeddings/ at a time (a build of the folder included)
        r = embed_shards(args.shard_dir, TextEncoder, name, batch_size=int(e.batch_size), max_spans=e.max_spans,
                         force=args.force, device=e.device, descriptor_format=e.descriptor_format,
                         fields=fields_for(str(e.positives)), workers=int(e.workers),
                         precision=str(e.precision))
    if r.reused:
        print(f"embeddings of {args.shard_dir} are current ({name})")
    else:
        print(f"{r.pages} pages, {r.texts} texts, {r.encoded} encoded ({r.repeat_share:.1%} repeats) with {name} "
              f"-> {Path(args.shard_dir) / 'embeddings'} [{r.seconds:.1f} s, {r.pages / max(r.seconds, 1e-9):.2f} pages/s, "
              f"{r.texts / max(r.seconds, 1e-9):.1f} texts/s]")
    return 0


def main(argv: list[str] | None = None) -> int:
    from gsdistill.tuples.cli import main as tuples_main
    return tuples_main(argv, embed=embed)
