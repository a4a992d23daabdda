"""Throughput of the data pipeline, side by side in one run, against what pretraining consumes.

    python tools/bench/bench_data.py                       # arXiv PDFs from ../shared/data when present
    python tools/bench/bench_data.py --pdfs DIR --pages 60 --synthetic 60 --workers 2
    python tools/bench/bench_data.py --build-pages 1000 --build-only    # tuples build: 1 vs 2 workers, memory
    python tools/bench/bench_data.py --embed-pages 411 --embed-only     # tuples embed: today's vs new, memory
    python tools/bench/bench_data.py --views-cost 256 --against /tmp/old  # issue 56: worker CPU per page, decode costs

Prints pages/s of (1) PDF -> page tuples (render at --dpi + layout), (2) synthetic page
generation at the pretraining page size, (3) reading shards + MultiCropViews (the pretraining
default views) through a DataLoader with --workers workers. Each is divided by the pretraining
default ``optim.batch_size`` (pages per step): the result is how many optimizer steps per second
that stage alone could feed. Then pages/s per reader for 1, 2 and 4 shard readers (DataLoader
workers reading one shard set at once, split by shard) and the share of the bytes each opens. Embeddings are random stand-ins (the text cache is measured by
``gsdistill tuples embed``), so (3) is image decoding + crops + masks + collation only.
``--build-pages N``: ``gsdistill tuples build`` on real PDFs with 1 and ``--build-workers`` workers
(pages/s, pages per CPU-second, identical shards), then peak memory of 200 vs 2,000 pages.
``--synthetic-build N``: the synthetic pages a run without ``data.shards`` makes first
(``prepare_synthetic``: ``gsdistill.tuples.builder.synthetic_sets``), at the GPU recipe's page size and
shard count, with 1 and ``--build-workers`` workers, alternating, ``--repeats`` times each.

    python tools/bench/bench_data.py --synthetic-build 256 --build-only   # issue 32: >= 1.6x with 2 workers on 2 cores
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gsdistill.config import load_config
from gsdistill.tuples.sources.pdf import pdf_pages
from gsdistill.tuples.store.reader import ShardDataset
from gsdistill.tuples.store.writer import write_shards
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.views.multicrop import MultiCropViews, collate_pretrain
from bench_views_cost import add_views_cost_arguments, views_cost_report  # noqa: E402  (tools/ is on sys.path)


class WithStandInEmbeddings:
    """Views of a page after attaching random span / descriptor embeddings (picklable for workers)."""

    def __init__(self, views: MultiCropViews, dim: int = 384):
        self.views, self.dim = views, dim

    def __call__(self, page: dict) -> dict:
        rng = np.random.default_rng(len(page["spans"]))
        page["sem_emb"] = rng.standard_normal((len(page["spans"]), self.dim), dtype=np.float32)
        page["geom_emb"] = rng.standard_normal((len(page["boxes"]), self.dim), dtype=np.float32)
        for key in ("sp_sem_emb", "sp_geom_emb", "sp_joint_emb"):
            page[key] = rng.standard_normal(self.dim, dtype=np.float32)
        return self.views(page)


def default_pdfs() -> Path | None:
    here = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "arxiv_pdfs_docbank"
    return here if here.is_dir() else None


def make_pdf(path: Path, pages: int) -> Path:
    import pymupdf
    doc = pymupdf.open()
    for i in range(pages):
        page = doc.new_page()
        page.insert_text((72, 80), f"Section {i}", fontsize=14, fontname="hebo")
        page.insert_textbox(pymupdf.Rect(72, 100, 540, 700), "Body text of a generated page. " * 120, fontsize=10)
    doc.save(path)
    return path


def bench_pdf(folder: Path, n: int, dpi: int) -> float:
    files = sorted(folder.glob("*.pdf"))
    pages = itertools.chain.from_iterable(pdf_pages(f, dpi=dpi) for f in files)
    t0 = time.perf_counter()
    count = sum(1 for _ in itertools.islice(pages, n))
    return count / (time.perf_counter() - t0)


def bench_synthetic(n: int, width: int, height: int) -> float:
    t0 = time.perf_counter()
    count = sum(1 for _ in generate_pages(n, seed=1, width=width, height=height))
    return count / (time.perf_counter() - t0)


def bench_loading(shards: Path, cfg, workers: int, batches: int) -> float:
    views = MultiCropViews.from_config(cfg.views, patch_size=16, seed=0)
    ds = ShardDataset(shards, rank=0, world_size=1, transform=WithStandInEmbeddings(views), embeddings=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=int(cfg.optim.batch_size), num_workers=workers,
                                         collate_fn=collate_pretrain, persistent_workers=False)
    it = iter(loader)
    first = next(it)  # worker start-up is not throughput
    t0, count = time.perf_counter(), 0
    for batch in itertools.islice(it, batches):
        count += len(batch["ids"])
    del first
    return count / (time.perf_counter() - t0)


class DecodeOnly:
    """Transform that decodes the page image (the reader's own work) and keeps only the id (picklable)."""

    def __call__(self, page: dict) -> str:
        page["image"].convert("RGB")
        return page["id"]


def bench_readers(shards: Path, readers: int) -> tuple[float, float]:
    """(pages/s per reader, share of the shard bytes each reader opens) with ``readers`` DataLoader
    workers reading concurrently, each streaming only its own shards (split by shard)."""
    ds = ShardDataset(shards, rank=0, world_size=1, transform=DecodeOnly(), embeddings=False)
    sizes = [f.stat().st_size for f in ds.files]
    pages = ds.pages_per_shard()  # a run ending inside a shard stops early: count the bytes up to its end
    opened = [sum(sizes[p.shard] * p.stop / pages[p.shard] for p in ds.reader_parts(r, readers)) for r in range(readers)]
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=readers if readers > 1 else 0)
    t0 = time.perf_counter()
    count = sum(1 for _ in loader)
    return count / (time.perf_counter() - t0) / readers, max(opened) / sum(sizes)


def build_command(src: Path, out: Path, pages: int, workers: int, pages_per_shard: int, dpi: int) -> list[str]:
    return [sys.executable, "-m", "gsdistill.cli", "tuples", "build", "--from", "pdf", str(src), "--out", str(out),
            "--max-pages", str(pages), "--workers", str(workers), "--pages-per-shard", str(pages_per_shard),
            "--dpi", str(dpi), "build.progress=false"]


def bench_build(cmd: list[str]) -> tuple[float, float, int, float]:
    """(pages/s, peak resident MiB, pages, pages per CPU-second) of one ``gsdistill tuples build`` in
    a child process. The time is the whole command (planning, workers starting, shards, manifest);
    memory and CPU time are those of the build process and its workers, measured by a shim process
    whose only children they are (``RUSAGE_CHILDREN``: the largest peak, the summed CPU time).
    Pages per CPU-second is the rate per core, which other jobs on a shared machine do not lower."""
    shim = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
            "r = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "print(time.perf_counter() - t, r.ru_maxrss, r.ru_utime + r.ru_stime)")
    seconds, maxrss_kib, cpu = subprocess.run([sys.executable, "-c", shim, *cmd], check=True, capture_output=True,
                                              text=True, env=dict(os.environ, OMP_NUM_THREADS="1")).stdout.split()
    out = Path(cmd[cmd.index("--out") + 1])
    pages = json.loads((out / "manifest.json").read_text())["pages"]
    return pages / float(seconds), int(maxrss_kib) / 1024, pages, pages / float(cpu)


SYNTHETIC_CHILD = """
import json, resource, sys, time
from gsdistill.tuples.builder.synthetic_sets import build_synthetic
def cpu():
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
kwargs = json.loads(sys.argv[1])
t, c = time.perf_counter(), cpu()
pages = build_synthetic(**kwargs)["pages"]
print(time.perf_counter() - t, cpu() - c, pages)
"""


def bench_synthetic_build(out: Path, pages: int, workers: int, recipe: str) -> tuple[float, float]:
    """(pages/s, pages per CPU-second) of ``prepare_synthetic``'s build of ``recipe``'s pages (its
    page size, text scale and readers) in a child process, timed from after its imports: what the
    build adds to a training process that has them."""
    d = load_config("pretrain", recipe).data
    kwargs = dict(pages=pages, out_dir=str(out), seed=0, width=d.page_width, height=d.page_height,
                  text_scale=d.text_scale, readers=max(1, d.num_workers), workers=workers, progress=False)
    seconds, cpu, made = subprocess.run([sys.executable, "-c", SYNTHETIC_CHILD, json.dumps(kwargs)], check=True,
                                        capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                                        ).stdout.split()
    return int(made) / float(seconds), int(made) / float(cpu)


def synthetic_build_section(args, tmp: Path) -> None:
    """Pages/s of the synthetic build with 1 and ``--build-workers`` processes, run alternately so
    that load from other jobs falls on both alike; the medians and their ratio."""
    import statistics

    workers = (1, args.build_workers)
    rates = {w: [] for w in workers}
    for r in range(args.repeats):
        for w in workers:
            out = tmp / f"synthetic-{r}-w{w}"
            rates[w].append(bench_synthetic_build(out, args.synthetic_build, w, args.recipe))
    shards = len(list((tmp / f"synthetic-0-w{workers[-1]}").glob("shard-*.tar")))
    same = all((tmp / "synthetic-0-w1" / f.name).read_bytes() == f.read_bytes()
               for f in sorted((tmp / f"synthetic-0-w{workers[-1]}").glob("shard-*.tar")))
    median = {w: statistics.median(r[0] for r in runs) for w, runs in rates.items()}
    print(f"\nsynthetic build ({args.recipe} pages, {args.synthetic_build} pages in {shards} shards; "
          f"{args.repeats} runs each, alternating; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores at the end)")
    print(f"{'workers':<10}{'pages/s (median)':>18}{'speed-up':>10}{'pages/CPU-s':>13}   pages/s of each run")
    for w, runs in rates.items():
        print(f"{w:<10}{median[w]:>18.1f}{median[w] / median[1]:>10.2f}{statistics.median(r[1] for r in runs):>13.1f}"
              f"   {' '.join(f'{r[0]:.1f}' for r in runs)}")
    print(f"shards identical for 1 and {workers[-1]} workers: {same}")


def build_section(args, tmp: Path) -> None:
    """``tuples build`` on real PDFs: pages/s with 1 and ``--build-workers`` processes on the same
    pages (identical output checked), then peak memory of a 1-process build of few and many pages."""
    src = args.build_pdfs
    rates = {}
    for workers in (1, args.build_workers):
        out = tmp / f"build-w{workers}"
        rates[workers] = bench_build(build_command(src, out, args.build_pages, workers, args.build_pages_per_shard,
                                                   args.dpi))
    same = all((tmp / "build-w1" / f.name).read_bytes() == f.read_bytes()
               for f in sorted((tmp / f"build-w{args.build_workers}").glob("shard-*.tar")))
    print(f"\ntuples build --from pdf {src} ({rates[1][2]} pages, {args.build_pages_per_shard} per shard, "
          f"{args.dpi} dpi; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores at the end)")
    print(f"{'workers':<10}{'pages/s':>10}{'speed-up':>10}{'pages/CPU-s':>13}{'peak MiB':>10}")
    for workers, (rate, mib, _, per_cpu) in rates.items():
        print(f"{workers:<10}{rate:>10.1f}{rate / rates[1][0]:>10.2f}{per_cpu:>13.1f}{mib:>10.0f}")
    print(f"shards identical for 1 and {args.build_workers} workers: {same}")
    small, large = (bench_build(build_command(src, tmp / f"mem-{n}", n, 1, args.build_pages_per_shard, args.dpi))
                    for n in args.build_memory)
    print(f"peak resident memory, 1 worker: {small[2]} pages {small[1]:.0f} MiB, {large[2]} pages {large[1]:.0f} MiB "
          f"(ratio {large[1] / small[1]:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdfs", type=Path, default=None, help="folder of PDFs (default: shared arXiv PDFs)")
    ap.add_argument("--pages", type=int, default=40, help="PDF pages to convert")
    ap.add_argument("--dpi", type=int, default=72)
    ap.add_argument("--synthetic", type=int, default=48, help="synthetic pages to generate")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=4, help="DataLoader batches timed after the first")
    ap.add_argument("--reader-pages", type=int, default=160, help="pages of the shard set the readers split")
    ap.add_argument("--build-pdfs", type=Path, default=Path("/usr/share/doc/texlive-doc"),
                    help="PDF folder for the tuples build section")
    ap.add_argument("--build-pages", type=int, default=0, help="pages the build section times (0: no build section)")
    ap.add_argument("--build-workers", type=int, default=2, help="workers timed against 1 in the build section")
    ap.add_argument("--build-pages-per-shard", type=int, default=32, help="a unit of work: units >> workers")
    ap.add_argument("--build-memory", type=int, nargs=2, default=(200, 2000), help="pages of the two memory builds")
    ap.add_argument("--build-only", action="store_true", help="run only the build section(s)")
    ap.add_argument("--synthetic-build", type=int, default=0,
                    help="pages of the synthetic build section (prepare_synthetic; 0: no such section)")
    ap.add_argument("--recipe", default="gpu_vit_s16", help="pretrain experiment whose page size and readers it uses")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each worker count (synthetic build), rounds (views cost)")
    ap.add_argument("--embed-pdfs", type=Path, default=Path("/usr/share/doc/texlive-doc"),
                    help="PDF folder for the tuples embed section (tools/bench/bench_embed.py)")
    ap.add_argument("--embed-pages", type=int, default=0, help="pages the embed section times (0: no embed section)")
    ap.add_argument("--embed-workers", type=int, nargs="+", default=[1, 2], help="encoder processes of the new path")
    ap.add_argument("--embed-threads", type=int, default=2, help="torch threads in all (today's path: one process)")
    ap.add_argument("--embed-precisions", nargs="+", default=["fp32", "bf16"], help="precisions of the new path")
    ap.add_argument("--embed-memory", type=int, nargs="*", default=[200, 2000],
                    help="pages of the embed memory runs (none: skip them)")
    ap.add_argument("--embed-only", action="store_true", help="run only the embed section")
    add_views_cost_arguments(ap)  # --views-cost PAGES, --against OLD_TREE, --views-batch: tools/bench/bench_views_cost.py
    if (args := ap.parse_args()).views_cost:
        return views_cost_report(args)
    if args.synthetic_build:
        with tempfile.TemporaryDirectory() as tmp:
            synthetic_build_section(args, Path(tmp))
    if args.build_pages:
        with tempfile.TemporaryDirectory() as tmp:
            build_section(args, Path(tmp))
    if args.build_only:
        return
    if args.embed_pages or args.embed_only:
        from bench_embed import report as embed_report  # tools/ is on sys.path when this file runs
        with tempfile.TemporaryDirectory() as tmp:
            embed_report(args.embed_pdfs, args.embed_pages, args.embed_memory, args.embed_workers,
                         args.embed_precisions, args.embed_threads, Path(tmp))
        if args.embed_only:
            return
    cfg = load_config("pretrain")
    bs, w, h = int(cfg.optim.batch_size), int(cfg.data.page_width), int(cfg.data.page_height)
    with tempfile.TemporaryDirectory() as tmp:
        pdfs = args.pdfs or default_pdfs()
        if pdfs is None:
            pdfs = Path(tmp) / "pdfs"
            pdfs.mkdir()
            make_pdf(pdfs / "generated.pdf", args.pages)
        n_pages = bs * (args.batches + 1) * max(args.workers, 1)
        write_shards(generate_pages(n_pages, seed=2, width=w, height=h), Path(tmp) / "shards",
                     pages_per_shard=max(1, n_pages // 4), progress=False)
        write_shards(generate_pages(args.reader_pages, seed=3, width=w, height=h), Path(tmp) / "readers",
                     pages_per_shard=max(1, args.reader_pages // 8), progress=False)
        per_reader = {n: bench_readers(Path(tmp) / "readers", n) for n in (1, 2, 4)}
        rates = {f"PDF -> tuples ({args.dpi} dpi, {pdfs.name})": bench_pdf(pdfs, args.pages, args.dpi),
                 f"synthetic generation ({w}x{h})": bench_synthetic(args.synthetic, w, h),
                 f"shards + views + collate ({args.workers} workers)": bench_loading(Path(tmp) / "shards", cfg,
                                                                                     args.workers, args.batches)}
    print(f"pretraining default: optim.batch_size = {bs} pages per step, views {cfg.views.n_global}x"
          f"{cfg.views.global_size} + {cfg.views.n_local}x{cfg.views.local_size}")
    print(f"{'stage':<48}{'pages/s':>10}{'steps/s fed':>14}")
    for name, rate in rates.items():
        print(f"{name:<48}{rate:>10.1f}{rate / bs:>14.2f}")
    print(f"\nshard readers (read + decode, {args.reader_pages} pages in 8 shards; readers run at once on this machine's cores)")
    print(f"{'readers':<10}{'pages/s per reader':>20}{'bytes opened per reader':>26}")
    for n, (rate, share) in per_reader.items():
        print(f"{n:<10}{rate:>20.1f}{share:>25.1%}")


if __name__ == "__main__":
    main()
