"""Does a box-descriptor format keep the page geometry after the frozen text encoder? (issue 11 item 4)

    OMP_NUM_THREADS=1 python tools/bench/bench_descriptors.py [--synthetic-pages 200] [--formats a,b]
        [--real ../shared/data] [--no-real] [--cache /tmp/gsdistill-bench-descriptors]

Per page set (synthetic pages; real pages: DocBank samples, PubLayNet examples, arXiv PDFs) and per
format (every ``gsdistill.tuples.descriptors.FORMATS`` entry, plus ``box-encoder-init``: the learned
box encoder of ``gsdistill.models.box_encoder`` at initialisation, seed 0) it prints:

* ``within`` / ``between``: mean cosine of two descriptors of one page / of two different pages;
* ``own@32``: share of descriptors whose nearest page centroid (leave-one-out for their own page)
  is their own page's, among batches of 32 pages (a training batch; chance 1/32 = 0.031); pages
  with one box are left out;
* ``distinct``: distinct descriptor strings / descriptors;
* ``rho_table``: Spearman correlation, over all pairs of ``--tables`` random Table boxes (seed 0),
  between embedding cosine and geometric closeness = -L1 distance of (centre x, centre y, width,
  height) in 0..1000 of the page; ``rho_all``: the same over same-class pairs of every class (at
  most ``--tables`` boxes per class), pooled.

Embeddings are cached per (encoder, text) in ``--cache`` so a rerun encodes only new texts.

``--fit-formats a,b`` adds a training check per format: the geometric head alone (alignment only,
lambda_sem 0, no self-distillation), ``--fit-pages`` synthetic training pages (seed 3, 256x320) as
one full-page batch at 64 px, ``--fit-steps`` steps at lr 1e-3, then geometric Acc@1 (all of a
page's descriptors find it) on the training pages and on ``--fit-heldout`` held-out pages (seed 4).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from gsdistill.tuples.descriptors import FORMATS, box_geometry, box_texts

BOX_ENCODER = "box-encoder-init"


def synthetic_pages(n: int, seed: int) -> list[dict]:
    from gsdistill.tuples.sources.synthetic import generate_pages
    return [_boxes_only(p) for p in generate_pages(n, seed=seed)]


def real_pages(root: Path) -> list[dict]:
    """DocBank samples and arXiv PDFs through the project's builders; PubLayNet's COCO boxes mapped
    with its label table (its builder wants text cells or OCR for spans, which the bench needs not)."""
    from gsdistill.tuples.sources.coco import clip_box, read_coco
    from gsdistill.tuples.sources.docbank import docbank_pages
    from gsdistill.tuples.labels import to_doclaynet
    from gsdistill.tuples.sources.pdf import pdf_pages

    pages = [_boxes_only(p) for p in docbank_pages(root / "docbank_samples")]
    for pdf in sorted((root / "arxiv_pdfs_docbank").glob("*.pdf")):
        pages += [_boxes_only(p) for p in pdf_pages(pdf)]
    coco = read_coco(root / "publaynet_examples" / "samples.json")
    names = {c["id"]: c["name"] for c in coco["categories"]}
    for img in coco["images"]:
        w, h = int(img["width"]), int(img["height"])
        boxes = []
        for a in coco["annotations"]:
            box = clip_box(a["bbox"], w, h)[0] if a["image_id"] == img["id"] else None
            if box is not None:
                boxes.append({"category": to_doclaynet(names[a["category_id"]], "publaynet"), "bbox": box})
        pages.append({"id": img["file_name"], "width": w, "height": h, "boxes": boxes})
    return [p for p in pages if p["boxes"]]


def _boxes_only(page: dict) -> dict:
    return {k: page[k] for k in ("id", "width", "height", "boxes")}


class EmbeddingCache:
    """Frozen-encoder embeddings of texts, kept in one ``.npy`` per text hash under ``folder``."""

    def __init__(self, folder: Path, encoder: str | None = None):
        self.folder, self.encoder_name, self._encoder = folder, encoder, None
        folder.mkdir(parents=True, exist_ok=True)

    def _path(self, text: str) -> Path:
        digest = hashlib.sha1(f"{self.encoder_name}\0{text}".encode()).hexdigest()
        return self.folder / digest[:2] / f"{digest}.npy"

    def encode(self, texts: list[str]) -> np.ndarray:
        unique = sorted(set(texts))
        missing = [t for t in unique if not self._path(t).is_file()]
        if missing:
            if self._encoder is None:
                from gsdistill.models.text_encoder import TextEncoder
                self._encoder = TextEncoder(self.encoder_name)
            for text, row in zip(missing, self._encoder.encode(missing, batch_size=128).numpy()):
                self._path(text).parent.mkdir(exist_ok=True)
                np.save(self._path(text), row.astype(np.float32))
        rows = {t: np.load(self._path(t)) for t in unique}
        return np.stack([rows[t] for t in texts])


def box_encoder_embeddings(pages: list[dict]) -> np.ndarray:
    from gsdistill.models.box_encoder import BoxEncoder, page_boxes
    torch.manual_seed(0)
    encoder = BoxEncoder().eval()
    with torch.no_grad():
        return torch.cat([encoder(*page_boxes(p)) for p in pages]).numpy()


def geometry_closeness_rho(emb: np.ndarray, geometry: np.ndarray) -> float:
    """Spearman(cosine, -L1 distance of geometry) over all pairs of the given boxes."""
    i, j = np.triu_indices(len(emb), 1)
    closeness = -np.abs(geometry[i] - geometry[j]).sum(1)
    return float(spearmanr((emb[i] * emb[j]).sum(1), closeness).statistic)


def own_centroid_share(emb: np.ndarray, page_of: np.ndarray, batch_pages: int = 32) -> float:
    """Share of descriptors nearest (cosine) their own page's leave-one-out centroid, per batch of pages."""
    hits = []
    for start in range(0, int(page_of.max()) + 1, batch_pages):
        keep = (page_of >= start) & (page_of < start + batch_pages)
        x, q = emb[keep], page_of[keep] - start
        sums = np.zeros((int(q.max()) + 1, x.shape[1]))
        np.add.at(sums, q, x)
        counts = np.bincount(q)
        sims = x @ sums.T / np.maximum(np.linalg.norm(sums, axis=1), 1e-9)
        rest = sums[q] - x  # own centroid without the descriptor itself
        sims[np.arange(len(x)), q] = (x * rest).sum(1) / np.maximum(np.linalg.norm(rest, axis=1), 1e-9)
        valid = counts[q] > 1
        hits.append((sims.argmax(1) == q)[valid])
    return float(np.concatenate(hits).mean())


def measure(emb: np.ndarray, texts: list[str] | None, page_of: np.ndarray, classes: np.ndarray,
            geometry: np.ndarray, n_per_class: int) -> dict:
    rng = np.random.default_rng(0)
    cos = emb @ emb.T
    same = page_of[:, None] == page_of[None]
    np.fill_diagonal(same, False)
    other = page_of[:, None] != page_of[None]
    out = {"within": cos[same].mean(), "between": cos[other].mean(), "own@32": own_centroid_share(emb, page_of),
           "distinct": f"{len(set(texts))}/{len(texts)}" if texts is not None else "-"}
    tables = np.flatnonzero(classes == "Table")
    pick = rng.choice(tables, min(n_per_class, len(tables)), replace=False)
    out["rho_table"] = geometry_closeness_rho(emb[pick], geometry[pick]) if len(pick) > 2 else float("nan")
    cos_all, close_all = [], []
    for c in sorted(set(classes)):
        idx = np.flatnonzero(classes == c)
        idx = rng.choice(idx, n_per_class, replace=False) if len(idx) > n_per_class else idx
        i, j = np.triu_indices(len(idx), 1)
        cos_all.append(cos[idx[i], idx[j]])
        close_all.append(-np.abs(geometry[idx[i]] - geometry[idx[j]]).sum(1))
    out["rho_all"] = float(spearmanr(np.concatenate(cos_all), np.concatenate(close_all)).statistic)
    out["n_table"] = len(pick)
    return out


def bench(name: str, pages: list[dict], formats: list[str], cache: EmbeddingCache, n_per_class: int) -> None:
    page_of = np.array([i for i, p in enumerate(pages) for _ in p["boxes"]])
    classes = np.array([b["category"] for p in pages for b in p["boxes"]])
    geometry = np.array([box_geometry(b["bbox"], p["width"], p["height"]) for p in pages for b in p["boxes"]])
    print(f"\n{name}: {len(pages)} pages, {len(classes)} boxes, {int((classes == 'Table').sum())} Table boxes")
    print(f"{'format':22s} {'rho_table':>9s} {'rho_all':>8s} {'within':>7s} {'between':>8s} {'own@32':>7s} {'distinct':>11s}")
    for fmt in formats:
        if fmt == BOX_ENCODER:
            texts, emb = None, box_encoder_embeddings(pages)
        else:
            texts = [t for p in pages for t in box_texts(p, fmt=fmt)]
            emb = cache.encode(texts)
        m = measure(emb, texts, page_of, classes, geometry, n_per_class)
        print(f"{fmt:22s} {m['rho_table']:9.3f} {m['rho_all']:8.3f} {m['within']:7.3f} {m['between']:8.3f} "
              f"{m['own@32']:7.3f} {m['distinct']:>11s}", flush=True)


FIT_OVERRIDES = ["objective.distill=false", "objective.ibot=false", "objective.koleo=false",
                 "objective.lambda_sem=0.0", "views.global_size=64", "views.n_global=1", "views.n_local=0",
                 "model.backbone.img_size=64", "optim.lr=1e-3", "optim.warmup_steps=10", "train.log_every=50",
                 "train.ckpt_every=100000", "train.progress=false", "train.tensorboard=false", "train.plots=false"]


def fit(fmt: str, n_train: int, n_heldout: int, steps: int, folder: Path) -> tuple[float, float]:
    """(training-page, held-out) geometric Acc@1 after fitting the geometric head on ``fmt``."""
    from gsdistill.config import load_config
    from gsdistill.tuples.store.reader import read_pages
    from gsdistill.tuples.store.writer import write_shards
    from gsdistill.tuples.sources.synthetic import generate_pages
    from gsdistill.models.text_encoder import DEFAULT_ENCODER, TextEncoder
    from gsdistill.tuples.embedding.stage import embed_shards
    from gsdistill.tuples.store.text_cache import open_embeddings
    from gsdistill.views.multicrop import MultiCropViews, collate_pretrain
    from gsdistill.eval.head_retrieval import head_retrieval
    from gsdistill.pretrain.checkpoint import load_pretrained
    from gsdistill.pretrain.data_stream import FixedBatches
    from gsdistill.pretrain.run import run_pretraining

    sets = {}
    for name, seed, n in (("train", 3, n_train), ("heldout", 4, n_heldout)):
        shards = folder / f"{name}-{n}"
        if not (shards / "manifest.json").is_file():
            write_shards(generate_pages(n, seed=seed, width=256, height=320), shards)
        embed_shards(shards, TextEncoder, DEFAULT_ENCODER, progress=False, descriptor_format=fmt)
        sets[name] = list(read_pages(shards, embeddings=open_embeddings(shards, required=True, descriptor_format=fmt)))
    views = MultiCropViews(global_size=64, n_global=1, n_local=0, global_scale=(1.0, 1.0), mask_prob=0.0,
                           color_jitter=0.0, blur_prob=0.0, seed=0)
    batch = collate_pretrain([views(p) for p in sets["train"]])
    torch.manual_seed(0)
    cfg = load_config("pretrain", None, [*FIT_OVERRIDES, f"optim.batch_size={n_train}", f"optim.steps={steps}"])
    run = run_pretraining(cfg, folder / f"run-{fmt}", lambda rank, world: FixedBatches([batch], rank, world))
    model = load_pretrained(run)
    return tuple(float(head_retrieval(model, sets[k], "geom", 64)["acc1"]) for k in ("train", "heldout"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synthetic-pages", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7, help="synthetic page set (other seeds than the demo's 0)")
    ap.add_argument("--formats", default=",".join([*FORMATS, BOX_ENCODER]))
    ap.add_argument("--real", type=Path, default=Path(__file__).resolve().parents[2].parent / "shared" / "data")
    ap.add_argument("--no-real", action="store_true")
    ap.add_argument("--tables", type=int, default=200, help="boxes per class for the Spearman pairs")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/gsdistill-bench-descriptors"))
    ap.add_argument("--fit-formats", default="", help="formats to fit the geometric head on (slow: minutes each)")
    ap.add_argument("--fit-pages", type=int, default=64)
    ap.add_argument("--fit-heldout", type=int, default=256)
    ap.add_argument("--fit-steps", type=int, default=200)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    formats = [f for f in args.formats.split(",") if f]
    fit_formats = [f for f in args.fit_formats.split(",") if f]
    unknown = [f for f in formats if f not in FORMATS and f != BOX_ENCODER] + [f for f in fit_formats if f not in FORMATS]
    if unknown:
        print(f"--formats: unknown {unknown}; choose from {', '.join([*FORMATS, BOX_ENCODER])}", file=sys.stderr)
        return 2
    cache = EmbeddingCache(args.cache)
    if args.synthetic_pages > 0 and formats:
        bench(f"synthetic (seed {args.seed})", synthetic_pages(args.synthetic_pages, args.seed), formats, cache, args.tables)
    if not args.no_real and formats:
        if not args.real.is_dir():
            print(f"--real {args.real}: no such folder (use --no-real)", file=sys.stderr)
            return 2
        bench(f"real ({args.real})", real_pages(args.real), formats, cache, args.tables)
    for fmt in fit_formats:
        train_acc, heldout_acc = fit(fmt, args.fit_pages, args.fit_heldout, args.fit_steps, args.cache / "fit")
        print(f"fit {fmt}: geometric Acc@1 training pages {train_acc:.3f} (chance {1 / args.fit_pages:.3f}), "
              f"held-out {heldout_acc:.3f} (chance {1 / args.fit_heldout:.3f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
