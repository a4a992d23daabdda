"""Throughput of the data pipeline, side by side in one run, against what pretraining consumes.

    python tools/bench_data.py                       # arXiv PDFs from ../shared/data when present
    python tools/bench_data.py --pdfs DIR --pages 60 --synthetic 60 --workers 2

Prints pages/s of (1) PDF -> page tuples (render at --dpi + layout), (2) synthetic page
generation at the pretraining page size, (3) reading shards + MultiCropViews (the pretraining
default views) through a DataLoader with --workers workers. Each is divided by the pretraining
default ``optim.batch_size`` (pages per step): the result is how many optimizer steps per second
that stage alone could feed. Then pages/s per reader for 1, 2 and 4 shard readers (DataLoader
workers reading one shard set at once, split by shard) and the share of the bytes each opens. Embeddings are random stand-ins (the text cache is measured by
``gsdistill tuples embed``), so (3) is image decoding + crops + masks + collation only.
"""
from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gsdistill.config import load_config
from gsdistill.tuples.pdf import pdf_pages
from gsdistill.tuples.shards import ShardDataset, write_shards
from gsdistill.tuples.synthetic import generate_pages
from gsdistill.views.multicrop import MultiCropViews, collate_pretrain


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
    here = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "arxiv_pdfs_docbank"
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdfs", type=Path, default=None, help="folder of PDFs (default: shared arXiv PDFs)")
    ap.add_argument("--pages", type=int, default=40, help="PDF pages to convert")
    ap.add_argument("--dpi", type=int, default=72)
    ap.add_argument("--synthetic", type=int, default=48, help="synthetic pages to generate")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batches", type=int, default=4, help="DataLoader batches timed after the first")
    ap.add_argument("--reader-pages", type=int, default=160, help="pages of the shard set the readers split")
    args = ap.parse_args()
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
