"""Cached text-encoder embeddings of page tuples: the cache's format, its reader and its writer.

The text encoder is frozen (paper 003, Table A2), so each text is embedded once and reused every
epoch. The cache lives beside the shards, ``<shard_dir>/embeddings/``: ``meta.json`` plus one
``.npz`` per shard holding, per page key, ``<key>.sem`` [S, D] (spans, reading order), ``<key>.geom``
[R, D] (box descriptors), ``<key>.sp_sem`` [D] (all spans as one text), ``<key>.sp_geom`` [D] (all
descriptors as one text) and ``<key>.sp_joint`` [D] (spans + descriptors as one text); ``meta.json``
lists the fields a cache holds (the whole-page ones only when an objective asked for them).

The cache is keyed by the encoder name, the descriptor format (``data.descriptor_format``, a
versioned name of ``gsdistill.tuples.descriptors.FORMATS``) and each shard's CONTENT
(``reader.shard_digest``, a hash of its page records): a shard rebuilt from an edited input gets
new vectors even when its tar keeps its byte size (tars are padded to 10 KiB). The embedding stage
(``gsdistill.tuples.embedding.stage.embed_shards``) re-embeds the shards whose content changed and everything when a
setting changed, saying in one line what it threw away (``reusable_fields``); a reader meeting a
stale cache (an unknown format, another format than the one it asks for, a shard whose content
changed) raises instead of silently using embeddings of other texts. This module only reads and
writes the cache: it neither reads shards nor encodes (the stage and the shard reader hand it
digests and vectors), so the data layer runs one way.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from gsdistill.tuples.descriptors import (DESCRIPTOR_VERSION, FORMATS, box_texts, check_format,
                                        single_positive_texts, span_texts)
from gsdistill.tuples.errors import DataError, writing

CACHE_DIR, META = "embeddings", "meta.json"
FORMAT = "gsdistill-text-cache/2"  # /2: shards keyed by content, not byte size
FIELDS = ("sem", "geom", "sp_sem", "sp_geom", "sp_joint")
MULTI_POSITIVE_FIELDS = ("sem", "geom")  # what the default (multi-positive) objective reads


def fields_for(positives: str) -> tuple[str, ...]:
    """The cache fields an objective reads (``objective.positives``): the whole-page texts of the
    single-positive rows are long (most of the encoder's time on real pages), so they are embedded
    only for those rows."""
    if positives not in ("multi", "single"):
        raise ValueError(f"positives must be 'multi' or 'single', got {positives!r}")
    return MULTI_POSITIVE_FIELDS if positives == "multi" else FIELDS


def page_texts(page: dict, max_spans: int | None = None, fmt: str | None = None,
               fields: tuple[str, ...] = FIELDS) -> dict[str, list[str] | str]:
    """The texts the encoder sees for one page, only of ``fields`` (semantic and geometric
    positives, SP variants); box descriptors in format ``fmt`` (default ``DESCRIPTOR_VERSION``)."""
    fmt = fmt or DESCRIPTOR_VERSION
    boxes = box_texts(page, fmt=fmt)
    texts = {"sem": span_texts(page, max_spans), "geom": boxes if max_spans is None else boxes[:max_spans],
             "sp_geom": " ".join(boxes)}
    if "sp_sem" in fields or "sp_joint" in fields:
        texts["sp_sem"], texts["sp_joint"] = single_positive_texts(page, fmt)
    return {f: texts[f] for f in FIELDS if f in fields}


def checked_format(name: str) -> str:
    """A registered format name; an unknown one is a config error (data./embed.descriptor_format)."""
    from gsdistill.config import ConfigError
    try:
        return check_format(name)
    except ValueError as e:
        raise ConfigError(f"descriptor_format: {e}") from None


def read_meta(shard_dir: Path) -> dict | None:
    """The cache's ``meta.json`` (None when there is no cache); a damaged one is a DataError."""
    path = Path(shard_dir) / CACHE_DIR / META
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable embeddings meta ({type(e).__name__}: {e}); "
                        f"rebuild with 'gsdistill tuples embed {shard_dir} --force'") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: not an embeddings meta (a {type(meta).__name__}); "
                        f"rebuild with 'gsdistill tuples embed {shard_dir} --force'")
    return meta


def cached_fields(meta: dict) -> tuple[str, ...]:
    """The fields a cache holds (caches written before fields were selectable hold all of them)."""
    return tuple(meta.get("fields") or FIELDS)


def cache_key(encoder: str, fmt: str, max_spans: int | None, digests: dict[str, str],
              precision: str = "fp32") -> dict:
    """What must match for cached vectors to be reused (besides holding the wanted fields):
    settings for the whole cache, and per shard file name its content digest."""
    return {"format": FORMAT, "encoder": encoder, "precision": precision, "descriptor_version": fmt,
            "max_spans": max_spans, "shards": digests}


def reusable_fields(meta: dict | None, key: dict, force: bool = False) -> tuple[dict[str, tuple[str, ...]], str]:
    """(shard name -> cached fields still valid for it, one line saying what ``key`` throws away of
    the cache ``meta``, "" if nothing). A changed setting (or ``force``) throws away every shard's
    vectors; otherwise those of the shards whose content changed or that left the folder."""
    if meta is None:
        return {}, ""
    old = meta.get("shards") if isinstance(meta.get("shards"), dict) else {}
    everything = f"threw away the cached text embeddings of all {len(old)} shards"
    if force:
        return {}, f"{everything} (--force)"
    # caches from before precision was a choice are fp32
    changed = [f"{k} {v!r} -> {key[k]!r}" for k, v in {"precision": "fp32", **meta}.items()
               if k in key and k != "shards" and v != key[k]]
    if changed:
        return {}, f"{everything}: {', '.join(changed)}"
    fields = cached_fields(meta)
    kept = {name: fields for name, digest in key["shards"].items() if old.get(name) == digest}
    stale = [name for name in key["shards"] if name in old and name not in kept]
    gone = [name for name in old if name not in key["shards"]]
    parts = [f"{len(stale)} of {len(key['shards'])} shards whose pages changed "
             f"({', '.join(stale[:5])}{', ...' if len(stale) > 5 else ''})"] if stale else []
    parts += [f"{len(gone)} shards no longer in the folder"] if gone else []
    return kept, ("threw away the cached text embeddings of " + " and ".join(parts)) if parts else ""


class CacheWriter:
    """Writes a cache shard by shard; ``meta.json`` is removed first and written last, so a cache cut
    short (killed, failed) is never read as current."""

    def __init__(self, shard_dir: Path, shard_stems: list[str]):
        self.dir = Path(shard_dir) / CACHE_DIR
        with writing(self.dir):
            if self.dir.is_symlink():  # the cache is written inside the shard folder, never through a link
                raise DataError(f"{self.dir}: is a link; the embedding cache is written only inside "
                                f"{self.dir.parent}: remove the link (its target is not touched)")
            self.dir.mkdir(exist_ok=True)
            from gsdistill.output_removal import discard
            discard(self.dir / META)
            for old in self.dir.glob("*.npz"):  # shards no longer in the folder, files of a killed run
                if old.stem not in shard_stems:
                    discard(old)  # what gsdistill wrote: never a file of the user's, never through a link

    def read_shard(self, shard_stem: str) -> dict[str, np.ndarray]:
        """The vectors already cached for one shard (kept when only new fields are added)."""
        path = self.dir / (shard_stem + ".npz")
        try:
            with np.load(path) as data:
                return {k: data[k] for k in data.files}
        except Exception as e:  # missing, truncated or corrupt: the cache cannot be extended
            raise DataError(f"{path}: cannot add fields to these embeddings ({type(e).__name__}: {e}); "
                            f"rebuild with 'gsdistill tuples embed {self.dir.parent} --force'") from None

    def write_shard(self, shard_stem: str, arrays: dict[str, np.ndarray]) -> None:
        tmp = self.dir / (shard_stem + ".tmp.npz")
        with writing(self.dir / (shard_stem + ".npz"), rerun="embed again"):
            np.savez(tmp, **arrays)
            tmp.replace(self.dir / (shard_stem + ".npz"))

    def finish(self, key: dict, dim: int, fields: tuple[str, ...]) -> None:
        meta = {**key, "dim": int(dim), "fields": [f for f in FIELDS if f in fields]}
        with writing(self.dir / META, rerun="embed again"):
            (self.dir / META).write_text(json.dumps(meta, indent=1))


class CachedEmbeddings:
    """Reader of a current cache: ``for_shard(path, digest)(key) -> {"sem_emb": ..., "sp_sem_emb": ...}``."""

    def __init__(self, shard_dir: Path, meta: dict):
        self.dir, self.meta = shard_dir / CACHE_DIR, meta

    def for_shard(self, shard: Path, digest: str) -> Callable[[str], dict]:
        """The lookup of one shard's pages; ``digest`` is the shard's content now
        (``reader.shard_digest``, computed by the shard reader): another than the cached one refuses."""
        path = self.dir / (shard.stem + ".npz")

        def damaged(e: Exception) -> DataError:
            return DataError(f"{path}: unreadable embeddings file, truncated or corrupt ({type(e).__name__}: {e}); "
                             "run 'gsdistill tuples embed'")
        try:
            data = np.load(path)
        except Exception as e:  # zipfile.BadZipFile, OSError, ...: numpy's errors name no file
            raise damaged(e) from None
        if self.meta["shards"].get(shard.name) != digest:
            data.close()
            raise DataError(f"{shard}: its pages changed since their text embeddings were cached (a rebuilt "
                            f"shard); run 'gsdistill tuples embed {self.dir.parent}'")

        def lookup(key: str) -> dict:
            try:
                return {f"{field}_emb": data[f"{key}.{field}"] for field in cached_fields(self.meta)}
            except KeyError:
                raise DataError(f"{shard}: page {key!r} has no cached embedding; run 'gsdistill tuples embed'") from None
            except Exception as e:  # a damaged member (bad CRC, cut stream) is found only when read
                raise damaged(e) from None
        return lookup


def open_embeddings(shard_dir: str | Path, required: bool = False, encoder: str | None = None,
                    descriptor_format: str | None = None,
                    fields: tuple[str, ...] = ()) -> CachedEmbeddings | None:
    """The cache of ``shard_dir`` if present (``None`` if absent, a DataError if ``required``); pass
    it to ``ShardDataset(embeddings=...)`` to attach the vectors to the pages. A stale one raises: a
    descriptor format that is not (or no longer) registered, another format than
    ``descriptor_format`` when one is named (``None`` accepts any registered format: the cache was
    made for the configured one by the embedding stage), another encoder than ``encoder`` when one
    is named, or a cache without all of ``fields`` (the single-positive rows' whole-page texts are
    embedded only when asked for). ``.meta["descriptor_version"]`` names the format."""
    shard_dir = Path(shard_dir)
    if shard_dir.is_file():
        shard_dir = shard_dir.parent
    meta = read_meta(shard_dir)
    if meta is None:
        if required:
            raise DataError(f"{shard_dir}: no cached text embeddings; run 'gsdistill tuples embed {shard_dir}'")
        return None
    if meta.get("format") != FORMAT:
        raise DataError(f"{shard_dir}: text embeddings in cache format {meta.get('format')!r}, this gsdistill reads "
                        f"{FORMAT!r}; rebuild with 'gsdistill tuples embed {shard_dir}'")
    cached = meta.get("descriptor_version")
    wanted = checked_format(descriptor_format) if descriptor_format is not None else None
    if cached not in FORMATS or (wanted is not None and cached != wanted):
        want = repr(wanted) if wanted else "a registered one (" + ", ".join(FORMATS) + ")"
        raise DataError(f"{shard_dir}: embeddings cached for descriptor format {cached!r}, wanted {want}; "
                        f"rebuild with 'gsdistill tuples embed {shard_dir}'")
    if encoder is not None and meta.get("encoder") != encoder:
        raise DataError(f"{shard_dir}: embeddings were made with {meta.get('encoder')!r}, not {encoder!r}; "
                        f"rebuild with 'gsdistill tuples embed {shard_dir} --encoder {encoder}'")
    missing = [f for f in fields if f not in cached_fields(meta)]
    if missing:
        raise DataError(f"{shard_dir}: the text cache holds {', '.join(cached_fields(meta))}, not {', '.join(missing)} "
                        f"(the whole-page texts of objective.positives=single); add them with "
                        f"'gsdistill tuples embed {shard_dir} embed.positives=single'")
    return CachedEmbeddings(shard_dir, meta)
