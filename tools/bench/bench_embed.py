"""``tuples embed`` on real pages: today's path against the embedding stage, side by side in one run.

Run through ``tools/bench/bench_data.py --embed-pdfs DIR`` (see there). Today's path is kept here as it
was before issue 24 (``todays_embed``): per shard, the distinct texts of that shard sorted by
characters, tokenized batch by batch, every field of every page; it is the baseline the ratios are
taken against and the reference the new vectors are compared with (cosine, every text).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gsdistill.models.text_encoder import DEFAULT_ENCODER, TextEncoder, mean_pool
from gsdistill.tuples.embedding.stage import embed_shards
from gsdistill.tuples.store.reader import decode_sample, iter_tar, list_shards, shard_digest
from gsdistill.tuples.store.text_cache import FIELDS, MULTI_POSITIVE_FIELDS, open_embeddings, page_texts


@torch.no_grad()
def todays_encode(enc: TextEncoder, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """``TextEncoder.encode`` before issue 24: sorted by characters, each batch tokenized and padded."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = []
    for start in range(0, len(texts), batch_size):
        idx = order[start:start + batch_size]
        batch = enc.tokenizer([texts[i] or " " for i in idx], padding=True, truncation=True,
                              max_length=enc.max_length, return_tensors="pt")
        hidden = enc.model(**batch).last_hidden_state
        out.append(F.normalize(mean_pool(hidden, batch["attention_mask"]).float(), dim=-1))
    emb = torch.cat(out)
    result = torch.empty_like(emb)
    result[torch.tensor(order)] = emb
    return result.numpy()


def todays_embed(enc: TextEncoder, shard_dir: Path, fields: tuple[str, ...]) -> tuple[dict, int, int]:
    """(``{"<key>.<field>": vectors}``, texts written, texts encoded): ``embed_shards`` before issue 24."""
    arrays, written, encoded = {}, 0, 0
    for shard in list_shards(shard_dir):
        pages = [decode_sample(k, p, str(shard), decode_images=False) for k, p in iter_tar(shard)]
        texts = [page_texts(p, fields=fields) for p in pages]
        unique = sorted({t for tx in texts for v in tx.values() for t in ([v] if isinstance(v, str) else v)})
        emb = todays_encode(enc, unique)
        row = {t: i for i, t in enumerate(unique)}
        encoded += len(unique)
        for page, tx in zip(pages, texts):
            for field, value in tx.items():
                idx = [row[value]] if isinstance(value, str) else [row[t] for t in value]
                arrays[f"{page['_key']}.{field}"] = emb[idx]
                written += len(idx)
    return arrays, written, encoded


def min_cosine(reference: dict, shard_dir: Path) -> float:
    """Lowest cosine between a reference vector and the cached one of the same text, over every text."""
    cache, lowest = open_embeddings(shard_dir, required=True), 1.0
    for shard in list_shards(shard_dir):
        lookup = cache.for_shard(shard, shard_digest(shard))
        for key, _ in iter_tar(shard):
            for name, got in lookup(key).items():
                want = reference[f"{key}.{name[:-len('_emb')]}"].reshape(got.shape)
                if got.size:
                    lowest = min(lowest, float(np.min(np.sum(want.reshape(-1, got.shape[-1]) *
                                                             got.reshape(-1, got.shape[-1]), axis=1))))
    return lowest


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the encoder workers, once joined)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def fresh_copy(shards: Path, dest: Path) -> Path:
    """The shards without any cache, so every run embeds from scratch."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(shards, dest, ignore=shutil.ignore_patterns("embeddings"))
    return dest


def compare(shards: Path, tmp: Path, workers: list[int], precisions: list[str], threads: int) -> list[tuple]:
    """Rows (path, fields, workers, precision, seconds, CPU seconds, pages, texts, encoded, min cosine
    to today's). CPU seconds barely change when other jobs share the machine; wall seconds do."""
    torch.set_num_threads(threads)
    pages = json.loads((shards / "manifest.json").read_text())["pages"]
    enc = TextEncoder(DEFAULT_ENCODER)
    rows, reference = [], {}
    for label, fields in (("all 5", FIELDS), ("default", MULTI_POSITIVE_FIELDS)):
        t0, c0 = time.perf_counter(), cpu_seconds()
        arrays, written, encoded = todays_embed(enc, shards, fields)
        rows.append(("today's", label, 1, "fp32", time.perf_counter() - t0, cpu_seconds() - c0, pages, written,
                     encoded, 1.0))
        reference.update(arrays)
    del enc
    for label, fields in (("all 5", FIELDS), ("default", MULTI_POSITIVE_FIELDS)):
        for precision in precisions:
            for w in workers:
                copy, c0 = fresh_copy(shards, tmp / "embed-copy"), cpu_seconds()
                r = embed_shards(copy, TextEncoder, DEFAULT_ENCODER, fields=fields, workers=w, device="cpu",
                                 progress=False, precision=precision)
                rows.append(("new", label, w, precision, r.seconds, cpu_seconds() - c0, r.pages, r.texts, r.encoded,
                             min_cosine(reference, copy)))
    return rows


def peak_rss(cmd: list[str]) -> tuple[float, float]:
    """(seconds, peak resident MiB of the command and its worker processes), measured by a shim whose
    only children they are (``RUSAGE_CHILDREN`` keeps the largest)."""
    shim = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", shim, *cmd], check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1")).stdout.split()
    return float(out[0]), int(out[1]) / 1024


def build(pdfs: Path, out: Path, pages: int) -> Path:
    if not (out / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "gsdistill.cli", "tuples", "build", "--from", "pdf", str(pdfs),
                        "--out", str(out), "--max-pages", str(pages), "build.progress=false"],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def embed_command(shards: Path, workers: int, precision: str) -> list[str]:
    return [sys.executable, "-m", "gsdistill.cli", "tuples", "embed", str(shards), "--force", "--workers", str(workers),
            "embed.device=cpu", f"embed.precision={precision}"]


def comparison(shards: Path, workers: list[int], precisions: list[str], threads: int, tmp: Path) -> None:
    print(f"\nembedding (tuples embed, {DEFAULT_ENCODER}, CPU, {threads} torch threads in all; "
          f"load before: {os.getloadavg()[0]:.2f})")
    rows = compare(shards, tmp, workers, precisions, threads)
    print(f"{'path':<9}{'fields':<9}{'workers':>8}{'prec':>6}{'s':>8}{'CPU s':>8}{'pages/s':>9}{'texts':>7}"
          f"{'encoded':>9}{'repeats':>9}{'texts/s':>9}{'texts/CPU-s':>12}{'min cos':>10}")
    for path, fields, w, prec, s, cpu, n, texts, encoded, cos in rows:
        print(f"{path:<9}{fields:<9}{w:>8}{prec:>6}{s:>8.1f}{cpu:>8.1f}{n / s:>9.2f}{texts:>7}{encoded:>9}"
              f"{1 - encoded / texts:>9.1%}{texts / s:>9.1f}{texts / cpu:>12.1f}{cos:>10.6f}")
    today = {f: (s, cpu) for p, f, _, _, s, cpu, *_ in rows if p == "today's"}
    for path, fields, w, prec, s, cpu, *_ in rows:
        if path == "new":
            print(f"new {fields} fields, {w} worker(s), {prec}: pages/s {today['all 5'][0] / s:.2f}x (CPU "
                  f"{today['all 5'][1] / cpu:.2f}x) today's all-field embed (the issue's 'today'); texts/s "
                  f"{today[fields][0] / s:.2f}x (CPU {today[fields][1] / cpu:.2f}x) today's on the same fields")
    print(f"load after: {os.getloadavg()[0]:.2f}")


def report(pdfs: Path, pages: int, memory_pages: list[int], workers: list[int], precisions: list[str], threads: int,
           tmp: Path) -> None:
    """The side-by-side comparison on ``pages`` real pages (none: skipped), then peak memory."""
    if pages:
        comparison(build(pdfs, tmp / f"embed-{pages}", pages), workers, precisions, threads, tmp)
    if memory_pages:
        print(f"\npeak resident memory of 'gsdistill tuples embed --force' (default fields, {workers[-1]} worker(s), "
              f"{precisions[-1]})")
        peaks = {}
        for n in memory_pages:
            s, peaks[n] = peak_rss(embed_command(build(pdfs, tmp / f"embed-{n}", n), workers[-1], precisions[-1]))
            print(f"{n:>6} pages: {peaks[n]:8.0f} MiB  ({s:.0f} s)")
        small, large = min(peaks), max(peaks)
        print(f"ratio {large} / {small} pages: {peaks[large] / peaks[small]:.2f}x")
