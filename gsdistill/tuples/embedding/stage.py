"""The embedding stage (``gsdistill tuples embed``): every distinct text of a shard directory through a
frozen encoder, into the text cache.

    store.reader (read pages) -> store.text_cache.page_texts (only the fields the objective reads)
      -> texts not seen recently (RecentVectors) -> EncoderPool -> store.text_cache.CacheWriter

It streams: one shard's pages and vectors at a time plus a bounded memo of recent vectors, so memory
does not grow with the corpus. Real documents repeat texts (running heads, footers, page numbers;
box descriptors of similar layouts): each distinct text is encoded once per shard and, while it is
among the ``memo_texts`` most recently used, once for every later shard too. The encoder is handed
in (``make_encoder``; the commands pass ``gsdistill.models.text_encoder.TextEncoder``), so the data
layer never imports the models package.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from gsdistill.output_folder import lock_folder
from gsdistill.threads import available_cores
from gsdistill.tuples.descriptors import DESCRIPTOR_VERSION
from gsdistill.tuples.embedding.encoder_pool import EncoderPool
from gsdistill.tuples.errors import DataError
from gsdistill.tuples.store.reader import decode_sample, iter_tar, list_shards, shard_digest
from gsdistill.tuples.store.text_cache import (FIELDS, CacheWriter, cache_key, checked_format, page_texts, read_meta,
                                         reusable_fields)

log = logging.getLogger("gsdistill.tuples")
MEMO_TEXTS = 32_768  # recent distinct texts whose vectors are kept: ~50 MB at MiniLM's 384 dims


@dataclass
class EmbedReport:
    """What one run of the stage did; ``texts`` counts every text written (a span, a descriptor or
    a whole-page text of one page), ``encoded`` the distinct ones the encoder saw."""
    shard_dir: Path
    pages: int = 0
    texts: int = 0
    encoded: int = 0
    seconds: float = 0.0
    reused: bool = False
    discarded: str = ""  # what of an older cache was thrown away, in one line ("" if nothing)

    @property
    def repeat_share(self) -> float:
        """Share of written texts that were not encoded because an equal text had been."""
        return 1.0 - self.encoded / self.texts if self.texts else 0.0


class RecentVectors:
    """Vectors of the ``capacity`` most recently used distinct texts (least recently used dropped)."""

    def __init__(self, capacity: int):
        self.capacity, self._rows = int(capacity), OrderedDict()

    def get(self, text: str) -> np.ndarray | None:
        row = self._rows.get(text)
        if row is not None:
            self._rows.move_to_end(text)
        return row

    def put(self, text: str, row: np.ndarray) -> None:
        self._rows[text] = row
        self._rows.move_to_end(text)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)


def embed_pages(pages: list[dict], fields: tuple[str, ...], encode: Callable[[list[str]], np.ndarray],
                memo: RecentVectors, dim: int, max_spans: int | None = None,
                fmt: str | None = None) -> tuple[dict[str, np.ndarray], int, int]:
    """(cache arrays ``{"<key>.<field>": vectors}``, texts written, texts encoded) for ``pages``:
    each distinct text not in ``memo`` is encoded once, in one ``encode`` call."""
    texts = [page_texts(p, max_spans, fmt, fields) for p in pages]
    distinct = dict.fromkeys(t for tx in texts for v in tx.values() for t in ([v] if isinstance(v, str) else v))
    known = {t: memo.get(t) for t in distinct}
    new = [t for t, row in known.items() if row is None]
    for text, row in zip(new, encode(new)):
        known[text] = row = row.copy()  # a view would keep the whole encoded array alive in the memo
        memo.put(text, row)
    arrays, written = {}, 0
    for page, tx in zip(pages, texts):
        for field, value in tx.items():
            if isinstance(value, str):
                arrays[f"{page['_key']}.{field}"], written = known[value], written + 1
            else:
                rows = [known[t] for t in value]
                arrays[f"{page['_key']}.{field}"] = np.stack(rows) if rows else np.zeros((0, dim), np.float32)
                written += len(rows)
    return arrays, written, len(new)


def _shard_pages(shard: Path) -> list[dict]:
    """A shard's pages without their image bytes (the stage reads text only)."""
    pages = [decode_sample(key, parts, str(shard), decode_images=False) for key, parts in iter_tar(shard)]
    for page in pages:
        page.pop("image")
    return pages


def embed_shards(shard_dir: str | Path, make_encoder: Callable, encoder: str, batch_size: int = 64,
                 max_spans: int | None = None, force: bool = False, device: str | None = None,
                 progress: bool = True, descriptor_format: str | None = None,
                 fields: tuple[str, ...] | None = None, workers: int = 1, precision: str = "fp32",
                 memo_texts: int = MEMO_TEXTS) -> EmbedReport:
    """Embed the texts of ``fields`` (default all of ``FIELDS``; ``text_cache.fields_for`` gives what an
    objective reads) of every page of ``shard_dir`` with ``make_encoder(encoder, device=...)``.

    Box descriptors are written in ``descriptor_format`` (default ``DESCRIPTOR_VERSION``; unknown
    names raise ConfigError). The cache is keyed by the settings (encoder, descriptor format,
    max_spans, ``precision``: fp32, bf16, see ``TextEncoder``) and each shard's content digest: a
    shard whose digest and settings match keeps its vectors (only fields it lacks, such as the
    whole-page texts a single-positive row asks for later, are added); a changed shard is embedded
    again, and a changed setting (or ``force``) embeds everything; what is thrown away is logged in
    one line (``EmbedReport.discarded``). On the CPU, ``workers`` processes of ``cores // workers``
    torch threads encode side by side.
    """
    from gsdistill.device import resolve_device

    t0 = time.perf_counter()
    shard_dir = Path(shard_dir)
    fmt = checked_format(descriptor_format or DESCRIPTOR_VERSION)
    files = list_shards(shard_dir)
    if not files:
        raise DataError(f"{shard_dir}: no shard to embed (the build kept no page; see its skipped.csv)")
    key = cache_key(encoder, fmt, max_spans, {f.name: shard_digest(f) for f in files}, precision)
    try:
        meta = read_meta(shard_dir)
    except DataError as e:  # a damaged meta.json: nothing of the cache can be trusted
        meta, damaged = None, f"threw away the text embeddings cache: {e}"
    else:
        damaged = ""
    kept, discarded = reusable_fields(meta, key, force)
    # every shard ends with the same fields: the wanted ones, plus those the kept shards hold
    wanted = tuple(f for f in FIELDS if f in (fields or FIELDS) or any(f in k for k in kept.values()))
    todo = {f: tuple(x for x in wanted if x not in kept.get(f.name, ())) for f in files}
    report = EmbedReport(shard_dir, discarded=damaged or discarded)
    if not report.discarded and not any(todo.values()):
        report.reused = True
        return report
    if report.discarded:
        log.warning("%s: %s", shard_dir, report.discarded)
    memo = RecentVectors(memo_texts)
    threads = max(1, available_cores() // max(1, int(workers)))
    encoding = any(todo.values())
    dev = str(resolve_device(device, key="embed.device")) if encoding else "cpu"
    # the folder is held while its cache is written (one writer; what is written is recorded as gsdistill's)
    with lock_folder(shard_dir), EncoderPool(make_encoder, encoder, dev, workers, threads, batch_size, precision) \
            if encoding else nullcontext() as pool:
        writer = CacheWriter(shard_dir, [f.stem for f in files])
        for f in tqdm([f for f in files if todo[f]], desc=f"embed {shard_dir.name} ({encoder})", unit="shard",
                      disable=not progress):
            pages = _shard_pages(f)
            arrays = writer.read_shard(f.stem) if kept.get(f.name) else {}
            new, written, encoded = embed_pages(pages, todo[f], pool.encode, memo, pool.dim, max_spans, fmt)
            arrays.update(new)
            writer.write_shard(f.stem, arrays)
            report.pages, report.texts, report.encoded = (report.pages + len(pages), report.texts + written,
                                                          report.encoded + encoded)
        writer.finish(key, pool.dim if encoding else meta["dim"], wanted)
    report.seconds = time.perf_counter() - t0
    return report
