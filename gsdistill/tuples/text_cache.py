"""Cached text-encoder embeddings of page tuples: the cache's format, its reader and its writer.

The text encoder is frozen (paper 003, Table A2), so each text is embedded once and reused every
epoch. The cache lives beside the shards, ``<shard_dir>/embeddings/``: ``meta.json`` plus one
``.npz`` per shard holding, per page key, ``<key>.sem`` [S, D] (spans, reading order), ``<key>.geom``
[R, D] (box descriptors), ``<key>.sp_sem`` [D] (all spans as one text), ``<key>.sp_geom`` [D] (all
descriptors as one text) and ``<key>.sp_joint`` [D] (spans + descriptors as one text); ``meta.json``
lists the fields a cache holds (the whole-page ones only when an objective asked for them).

The cache is keyed by the encoder name, the descriptor format (``data.descriptor_format``, a
versioned name of ``gsdistill.tuples.descriptors.FORMATS``) and each shard's size: the embedding
stage (``embed_stage.embed_shards``) rebuilds whenever any of them differs, and a reader meeting a
stale cache (an unknown format, or another format than the one it asks for) raises instead of
silently using embeddings of other texts. This module only reads and writes the cache: it neither
reads shards nor encodes (the stage hands it shard sizes and vectors), so the data layer runs one way.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from gsdistill.tuples.descriptors import (DESCRIPTOR_VERSION, FORMATS, box_texts, check_format,
                                        single_positive_texts, span_texts)
from gsdistill.tuples.errors import DataError

CACHE_DIR, META = "embeddings", "meta.json"
FORMAT = "gsdistill-text-cache/1"
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


def shard_fingerprints(shards: list[Path]) -> dict[str, int]:
    """Shard file name -> size in bytes: the part of the cache key that says the pages are the same."""
    return {f.name: f.stat().st_size for f in shards}


def checked_format(name: str) -> str:
    """A registered format name; an unknown one is a config error (data./embed.descriptor_format)."""
    from gsdistill.config import ConfigError
    try:
        return check_format(name)
    except ValueError as e:
        raise ConfigError(f"descriptor_format: {e}") from None


def read_meta(shard_dir: Path) -> dict | None:
    path = Path(shard_dir) / CACHE_DIR / META
    return json.loads(path.read_text()) if path.is_file() else None


def cached_fields(meta: dict) -> tuple[str, ...]:
    """The fields a cache holds (caches written before fields were selectable hold all of them)."""
    return tuple(meta.get("fields") or FIELDS)


def cache_key(encoder: str, fmt: str, max_spans: int | None, fingerprints: dict[str, int],
              precision: str = "fp32") -> dict:
    """What must match for cached vectors to be reused (besides holding the wanted fields)."""
    return {"format": FORMAT, "encoder": encoder, "precision": precision, "descriptor_version": fmt,
            "max_spans": max_spans, "shards": fingerprints}


def same_key(meta: dict | None, key: dict) -> bool:
    """``meta`` was written under ``key`` (caches from before precision was a choice are fp32)."""
    return meta is not None and all({"precision": "fp32", **meta}.get(k) == v for k, v in key.items())


class CacheWriter:
    """Writes a cache shard by shard; ``meta.json`` is removed first and written last, so a cache cut
    short (killed, failed) is never read as current."""

    def __init__(self, shard_dir: Path):
        self.dir = Path(shard_dir) / CACHE_DIR
        self.dir.mkdir(exist_ok=True)
        (self.dir / META).unlink(missing_ok=True)

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
        np.savez(tmp, **arrays)
        tmp.replace(self.dir / (shard_stem + ".npz"))

    def finish(self, key: dict, dim: int, fields: tuple[str, ...]) -> None:
        meta = {**key, "dim": int(dim), "fields": [f for f in FIELDS if f in fields]}
        (self.dir / META).write_text(json.dumps(meta, indent=1))


class CachedEmbeddings:
    """Reader of a current cache: ``for_shard(path)(key) -> {"sem_emb": ..., "sp_sem_emb": ...}``."""

    def __init__(self, shard_dir: Path, meta: dict):
        self.dir, self.meta = shard_dir / CACHE_DIR, meta

    def for_shard(self, shard: Path) -> Callable[[str], dict]:
        if self.meta["shards"].get(shard.name) != shard.stat().st_size:
            raise DataError(f"{shard}: changed since its embeddings were cached; run 'gsdistill tuples embed'")
        path = self.dir / (shard.stem + ".npz")

        def damaged(e: Exception) -> DataError:
            return DataError(f"{path}: unreadable embeddings file, truncated or corrupt ({type(e).__name__}: {e}); "
                             "run 'gsdistill tuples embed'")
        try:
            data = np.load(path)
        except Exception as e:  # zipfile.BadZipFile, OSError, ...: numpy's errors name no file
            raise damaged(e) from None

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
    cached = meta.get("descriptor_version")
    wanted = checked_format(descriptor_format) if descriptor_format is not None else None
    if meta.get("format") != FORMAT or cached not in FORMATS or (wanted is not None and cached != wanted):
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
