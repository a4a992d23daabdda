"""Cached text-encoder embeddings of every page's spans and box-text descriptors.

The text encoder is frozen (paper 003, Table A2), so each text is embedded once and reused every
epoch. The cache lives beside the shards, ``<shard_dir>/embeddings/``: ``meta.json`` plus one
``.npz`` per shard holding, per page key, ``<key>.sem`` [S, D] (spans, reading order), ``<key>.geom``
[R, D] (box descriptors), ``<key>.sp_sem`` [D] (all spans as one text), ``<key>.sp_geom`` [D] (all
descriptors as one text) and ``<key>.sp_joint`` [D] (spans + descriptors as one text).

The cache is keyed by the encoder name, the descriptor format (``data.descriptor_format``, a
versioned name of ``gsdistill.tuples.descriptors.FORMATS``) and each shard's size: ``embed_shards``
rebuilds whenever any of them differs, and a reader meeting a stale cache (an unknown format, or
another format than the one it asks for) raises instead of silently using embeddings of other texts.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

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
    return MULTI_POSITIVE_FIELDS if positives == "multi" else FIELDS


def page_texts(page: dict, max_spans: int | None = None, fmt: str | None = None) -> dict[str, list[str] | str]:
    """The texts the encoder sees for one page (semantic and geometric positives, SP variants);
    box descriptors in format ``fmt`` (default ``DESCRIPTOR_VERSION``)."""
    fmt = fmt or DESCRIPTOR_VERSION
    sp_sem, sp_joint = single_positive_texts(page, fmt)
    boxes = box_texts(page, fmt=fmt)
    return {"sem": span_texts(page, max_spans), "geom": boxes if max_spans is None else boxes[:max_spans],
            "sp_sem": sp_sem, "sp_geom": " ".join(boxes), "sp_joint": sp_joint}


def _fingerprints(shard_dir: Path) -> dict[str, int]:
    from gsdistill.tuples.shards import list_shards
    return {f.name: f.stat().st_size for f in list_shards(shard_dir)}


def _checked_format(name: str) -> str:
    """A registered format name; an unknown one is a config error (data./embed.descriptor_format)."""
    from gsdistill.config import ConfigError
    try:
        return check_format(name)
    except ValueError as e:
        raise ConfigError(f"descriptor_format: {e}") from None


def _read_meta(shard_dir: Path) -> dict | None:
    path = shard_dir / CACHE_DIR / META
    return json.loads(path.read_text()) if path.is_file() else None


def cached_fields(meta: dict) -> tuple[str, ...]:
    """The fields a cache holds (caches written before fields were selectable hold all of them)."""
    return tuple(meta.get("fields") or FIELDS)


def _is_current(meta: dict | None, encoder_name: str, shard_dir: Path, max_spans, fmt: str,
                fields: tuple[str, ...]) -> bool:
    return (meta is not None and meta.get("format") == FORMAT and meta.get("encoder") == encoder_name
            and meta.get("descriptor_version") == fmt and meta.get("max_spans") == max_spans
            and set(fields) <= set(cached_fields(meta)) and meta.get("shards") == _fingerprints(shard_dir))


def embed_shards(shard_dir: str | Path, encoder: str | None = None, batch_size: int = 64,
                 max_spans: int | None = None, force: bool = False, device: str | None = None,
                 progress: bool = True, descriptor_format: str | None = None,
                 fields: tuple[str, ...] | None = None) -> Path:
    """Embed every page's texts with the frozen ``encoder`` (default all-MiniLM-L6-v2); return ``shard_dir``.

    Box descriptors are written in ``descriptor_format`` (default ``DESCRIPTOR_VERSION``; unknown
    names raise ConfigError). ``fields`` (default all of ``FIELDS``; :func:`fields_for` gives what an
    objective reads) are the texts embedded. A current cache (same encoder, descriptor format,
    max_spans and shards, holding at least ``fields``) is reused; anything else is rebuilt from scratch.
    """
    from gsdistill.tuples.shards import iter_tar, list_shards, decode_sample
    from gsdistill.models.text_encoder import DEFAULT_ENCODER, TextEncoder

    shard_dir = Path(shard_dir)
    name = encoder or DEFAULT_ENCODER
    fmt = _checked_format(descriptor_format or DESCRIPTOR_VERSION)
    fields = tuple(f for f in FIELDS if f in (fields or FIELDS))  # canonical order
    if not force and _is_current(_read_meta(shard_dir), name, shard_dir, max_spans, fmt, fields):
        return shard_dir
    from gsdistill.device import resolve_device
    dev = str(resolve_device(device))
    enc = TextEncoder(encoder, device=dev)
    cache = shard_dir / CACHE_DIR
    cache.mkdir(exist_ok=True)
    (cache / META).unlink(missing_ok=True)  # invalid until the rebuild completes
    files = list_shards(shard_dir)
    for f in tqdm(files, desc=f"embed {shard_dir.name} ({name})", unit="shard", disable=not progress):
        pages = [decode_sample(k, p, str(f), decode_images=False) for k, p in iter_tar(f)]
        texts = [{f: v for f, v in page_texts(p, max_spans, fmt).items() if f in fields} for p in pages]
        unique = sorted({t for tx in texts for v in tx.values() for t in ([v] if isinstance(v, str) else v)})
        emb = enc.encode(unique, batch_size=batch_size).numpy().astype(np.float32)
        row = {t: i for i, t in enumerate(unique)}
        arrays = {}
        for page, tx in zip(pages, texts):
            for field in fields:
                value = tx[field]
                idx = [row[value]] if isinstance(value, str) else [row[t] for t in value]
                arr = emb[idx].reshape(len(idx), enc.dim)
                arrays[f"{page['_key']}.{field}"] = arr[0] if isinstance(value, str) else arr
        tmp = cache / (f.stem + ".tmp.npz")
        np.savez(tmp, **arrays)
        tmp.replace(cache / (f.stem + ".npz"))
    meta = {"format": FORMAT, "encoder": name, "descriptor_version": fmt, "dim": enc.dim,
            "max_spans": max_spans, "fields": list(fields), "shards": _fingerprints(shard_dir)}
    (cache / META).write_text(json.dumps(meta, indent=1))
    return shard_dir


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
                    descriptor_format: str | None = None) -> CachedEmbeddings | None:
    """The cache of ``shard_dir`` if present; a stale one raises: a descriptor format that is not (or
    no longer) registered, another format than ``descriptor_format`` when one is named (``None``
    accepts any registered format: the cache was made for the configured one by ``embed_shards``),
    another encoder than ``encoder`` when one is named. ``.meta["descriptor_version"]`` names the format."""
    shard_dir = Path(shard_dir)
    if shard_dir.is_file():
        shard_dir = shard_dir.parent
    meta = _read_meta(shard_dir)
    if meta is None:
        if required:
            raise DataError(f"{shard_dir}: no cached text embeddings; run 'gsdistill tuples embed {shard_dir}'")
        return None
    cached = meta.get("descriptor_version")
    wanted = _checked_format(descriptor_format) if descriptor_format is not None else None
    if meta.get("format") != FORMAT or cached not in FORMATS or (wanted is not None and cached != wanted):
        want = repr(wanted) if wanted else "a registered one (" + ", ".join(FORMATS) + ")"
        raise DataError(f"{shard_dir}: embeddings cached for descriptor format {cached!r}, wanted {want}; "
                        f"rebuild with 'gsdistill tuples embed {shard_dir}'")
    if encoder is not None and meta.get("encoder") != encoder:
        raise DataError(f"{shard_dir}: embeddings were made with {meta.get('encoder')!r}, not {encoder!r}; "
                        f"rebuild with 'gsdistill tuples embed {shard_dir} --encoder {encoder}'")
    return CachedEmbeddings(shard_dir, meta)
