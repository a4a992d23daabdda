"""Worker-side CPU time per page of the pretraining stream (issue 56), and what decoding a page costs.

Run through ``tools/bench/bench_data.py --views-cost PAGES --against OLD_TREE`` (see there). Each measurement is
a child process with one thread (``OMP_NUM_THREADS=1``, OpenCV and torch at 1) that runs what one DataLoader
worker runs for a rank (``data_stream._EpochBatches.batches``: read the shards, look the text embeddings up,
decode, make the views, collate, pad, draw the batch's iBOT masks) over embedded synthetic shards of the
recipe's page size, and reports CPU seconds per page (user + system, all threads). The variants run
alternately, round after round, so load from other jobs falls on all alike:

- ``old``: the tree at ``--against`` (``git worktree add /tmp/old 134b15e``), today's views, PNG shards;
- ``cpu``: this tree with ``views.device=cpu`` (the CPU path), shards in this tree's default storage (``zst``);
- ``device``: this tree with ``views.device=batched``: the worker side of the GPU path (the pixels are made
  in the training step, not here; the same work as ``views.device=cuda``), ``zst`` shards;
- ``device_png``: the same on the PNG shards (what the storage alone changes).

The shards are built once; the PNG copy has the same pages, members and text cache, only the image
members re-encoded (the cache is keyed by the json members). The ratio to ``old`` per round, its median and
a 95 % bootstrap interval over rounds are printed. ``decode_section``: decode time per page on one core
against size on disk for PNG (PIL: today's reader; OpenCV), JPEG, ``zst`` (``image_codec``) and raw pixels.
"""
from __future__ import annotations

import argparse
import io
import os
import tempfile
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHILD = r"""
import resource, sys
from gsdistill.config import load_config
from gsdistill.pretrain.data_stream import _EpochBatches
from gsdistill.threads import limit_worker_threads
limit_worker_threads(1)
shards, recipe, batch, pages, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
cfg = load_config("pretrain", recipe, extra)
batches = _EpochBatches(shards, cfg, 0, 1, batch, 16).batches(0, 0, 1)
next(batches)  # imports, the first shard opened, the encoder-free caches warm: not a worker's steady state
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
start, seen = cpu(), 0
for item in batches:  # (batch, rounds) here; a batch alone in trees before e2a6437
    seen += len((item[0] if isinstance(item, tuple) else item)["ids"])
    if seen >= pages:
        break
print((cpu() - start) / seen, seen)
"""

VARIANTS = {"old": [], "cpu": ["views.device=cpu"], "device": ["views.device=batched"],
            "device_png": ["views.device=batched"]}
PNG_SHARDS = ("old", "device_png")  # the variants that read the PNG copy


def worker_cost(tree: Path, shards: Path, recipe: str, batch: int, pages: int, extra: list[str]) -> float:
    """CPU seconds per page of one worker's stream in a child process importing ``tree``'s gsdistill."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(tree))
    run = subprocess.run([sys.executable, "-c", CHILD, str(shards), recipe, str(batch), str(pages), *extra],
                         capture_output=True, text=True, env=env, cwd=str(tree))
    if run.returncode:
        raise SystemExit(f"worker-cost run of {tree} {' '.join(extra)} failed:\n{run.stderr[-3000:]}")
    return float(run.stdout.split()[0])


def prepare_shards(out: Path, recipe: str, pages: int) -> Path:
    """Embedded synthetic shards of the recipe's pages (built once: the text encoder is the slow part)."""
    from gsdistill.config import load_config
    from gsdistill.pretrain.run import prepare_synthetic

    cfg = load_config("pretrain", recipe, [f"data.synthetic_pages={pages}", "data.num_workers=1",
                                           "train.progress=false", "train.device=cpu"])
    return prepare_synthetic(cfg, out)


def png_copy(shards: Path, out: Path) -> Path:
    """``shards`` with every page image re-encoded as PNG (members, order, json and text cache unchanged)."""
    import io as _io
    import shutil
    import tarfile

    from PIL import Image

    from gsdistill.tuples.store.image_codec import decode_rgb, encode_image

    shutil.copytree(shards, out)
    for tar_path in sorted(out.glob("shard-*.tar")):
        with tarfile.open(tar_path) as src, tarfile.open(tar_path.with_suffix(".png.tar"), "w") as dst:
            for member in src:
                data = src.extractfile(member).read()
                key, _, ext = member.name.partition(".")
                if ext in ("zst", "png", "jpg"):
                    data, member = encode_image(Image.fromarray(decode_rgb(data)), "png"), tarfile.TarInfo(f"{key}.png")
                member.size = len(data)
                dst.addfile(member, _io.BytesIO(data))
        tar_path.with_suffix(".png.tar").replace(tar_path)
    return out


def bootstrap_interval(ratios: list[float], draws: int = 10000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the median ratio over rounds resampled with replacement."""
    rng = np.random.default_rng(seed)
    r = np.asarray(ratios)
    medians = np.median(r[rng.integers(0, len(r), size=(draws, len(r)))], axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def views_cost_section(against: Path, tmp: Path, recipe: str, pages: int, batch: int, rounds: int) -> None:
    here = Path(__file__).resolve().parents[2]  # this checkout's root
    shards = tmp / "shards"  # kept between runs with --views-shards DIR (the text encoder is the slow part)
    if not (shards / "embeddings" / "meta.json").is_file():
        prepare_shards(shards, recipe, pages + batch)
    png = tmp / "shards_png" if (tmp / "shards_png").is_dir() else png_copy(shards, tmp / "shards_png")
    trees = {"old": against, "cpu": here, "device": here, "device_png": here}
    costs = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, extra in VARIANTS.items():
            costs[name].append(worker_cost(trees[name], png if name in PNG_SHARDS else shards, recipe, batch, pages,
                                           extra))
    print(f"\nworker-side CPU per page, {recipe} views ({pages} pages a run after a warm-up batch, batches of {batch}, "
          f"1 thread; {rounds} rounds, alternating; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores "
          "at the end)")
    print(f"{'variant':<10}{'ms/page (median)':>18}   each round")
    for name, runs in costs.items():
        print(f"{name:<10}{1e3 * np.median(runs):>18.2f}   {' '.join(f'{1e3 * r:.2f}' for r in runs)}")
    for name in ("cpu", "device", "device_png"):
        ratios = [n / o for n, o in zip(costs[name], costs["old"])]
        low, high = bootstrap_interval(ratios)
        print(f"{name} / old: {np.median(ratios):.3f} [{low:.3f}, {high:.3f}] "
              "(median of per-round ratios, 95 % bootstrap)")


def page_sets(recipe: str, n: int) -> dict[str, list]:
    """Pages to store: ``n`` synthetic pages of the recipe, and the first 4 pages of 6 arXiv PDFs of
    ../shared/data (when present) rendered at 72 and 144 dpi as ``tuples build --from pdf`` renders them."""
    import glob

    from gsdistill.config import load_config
    from gsdistill.tuples.sources.synthetic import generate_pages

    d = load_config("pretrain", recipe).data
    sets = {"synthetic": [p["image"] for p in generate_pages(
        n, seed=5, width=int(d.page_width), height=int(d.page_height), text_scale=float(d.text_scale))]}
    shared = Path(os.environ.get("GSDISTILL_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
    pdfs = sorted(glob.glob(str(shared / "arxiv_pdfs_docbank" / "**" / "*.pdf"), recursive=True))[:6]
    if pdfs:
        from gsdistill.tuples.sources.pdf import open_pdf, render
        for dpi in (72, 144):
            sets[f"arXiv PDF, {dpi} dpi,"] = [render(doc[i], dpi) for doc in map(open_pdf, pdfs)
                                                   for i in range(min(4, doc.page_count))]
    return sets


def decode_section(recipe: str, n: int = 24, repeats: int = 3) -> None:
    """Decode ms per page on one core against KB on disk: PNG as the shards stored it before ``zst``
    (PIL's compress level 1), JPEG q90, ``zst`` (``image_codec``) and raw pixels; PIL and OpenCV decoders."""
    import cv2
    from PIL import Image

    from gsdistill.tuples.store.image_codec import decode_zst, encode_image

    cv2.setNumThreads(1)
    pil = lambda b: np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))  # noqa: E731  (the CPU path's reader)
    ocv = lambda b: cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR)  # noqa: E731
    for label, images in page_sets(recipe, n).items():
        png, jpg, zst = ([encode_image(im, fmt) for im in images] for fmt in ("png", "jpg", "zst"))
        shapes = [np.asarray(im).shape for im in images]
        raw = [np.asarray(im.convert("RGB")).tobytes() for im in images]
        cases = {"PNG, PIL": (png, pil), "PNG, OpenCV": (png, ocv), "JPEG q90, PIL": (jpg, pil),
                 "JPEG q90, OpenCV": (jpg, ocv), "zst (image_codec: the default)": (zst, decode_zst),
                 "raw uint8": (raw, lambda b: np.frombuffer(b, np.uint8).copy())}
        print(f"\npage decode on one core ({len(images)} {label} pages, {shapes[0][1]}x{shapes[0][0]} first; "
              f"CPU ms per page, median of {repeats})")
        print(f"{'storage, decoder':<40}{'KB/page':>10}{'ms/page':>10}")
        for name, (blobs, decode) in cases.items():
            times = []
            for _ in range(repeats):
                start = time.process_time()
                for b in blobs:
                    decode(b)
                times.append((time.process_time() - start) / len(blobs))
            print(f"{name:<40}{np.mean([len(b) for b in blobs]) / 1024:>10.1f}{1e3 * np.median(times):>10.2f}")


def add_views_cost_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--views-cost", type=int, default=0, help="pages a worker-cost run times (issue 56; only this "
                    "section and the decode one run; --repeats rounds, --recipe's views)")
    ap.add_argument("--against", type=Path, default=Path("/tmp/old"),
                    help="today's tree (git worktree add /tmp/old HEAD)")
    ap.add_argument("--views-batch", type=int, default=64, help="pages per batch of the worker-cost runs")
    ap.add_argument("--views-shards", type=Path, default=None, help="folder to build the shards in once and reuse "
                    "(default: a temporary one)")


def views_cost_report(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        views_cost_section(args.against, args.views_shards or Path(tmp), args.recipe, args.views_cost,
                           args.views_batch, args.repeats)
    decode_section(args.recipe)
