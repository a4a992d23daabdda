"""Where does a frozen backbone keep page layout? A per-patch linear probe, block by block.

    python tools/probes/probe_layout_features.py --train runs/demo_pdfs/data/train --eval runs/demo_pdfs/data/eval \
        --backbone runs/demo_pdfs/pretrain/backbone [--size 320] [--out runs/probe_layout]
    python tools/probes/probe_layout_features.py --detect-data RUN/detect/labelled/data/data.yaml \
        --backbone RUN/pretrain/backbone --size 384      # `demo --coco`: the zones people drew

Head-only detection reads the last ViT block (gsdistill/detect/modules.py). When a pretrained backbone
detects no better than a random one, this asks why, without training a detector: each page is resized
to ``--size`` px, every 16 px patch gets the PubLayNet class of the box under its centre (or
background), and a linear softmax probe is fitted on the tokens of each block (and on the raw patch
pixels) of the training pages, then scored on held-out pages of other documents. Probes on the
pretrained backbone, on a random twin (same architecture, seeded init, as the detection control) and
on pixels are fitted in one run. Score: balanced accuracy over the 6 classes (background
dominates the patch count); interval: paired bootstrap over held-out documents (pretrained - random).
Writes ``probe.csv`` and prints a table.

``--stats-only`` skips the probes and prints, per block of each ``--backbone`` (several may be
given) and of the random twin, two numbers that show a collapsed feature map: the effective rank of
the held-out patch tokens (exp of the entropy of the normalised eigenvalues of their covariance; the
token width is its ceiling) and the mean cosine between two patch tokens of the same page after
removing the mean token over all pages (0: positions differ as much as pages; 1: every patch of a
page looks the same, so a detection head has nothing to localise with).

``--subpatch`` asks the other half of what a box edge needs: how much of each inked patch's own ink
arrangement (grey levels pooled to 4 x 4 cells of 4 px, centred and scaled per patch) a ridge regression
recovers from the tokens of each block, as held-out R^2 against the raw pixels and the random twin, with a
paired document bootstrap of the per-patch error (random - pretrained; above 0: the pretrained tokens keep more).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gsdistill.models.backbone import create_backbone, load_backbone, read_backbone_meta
from gsdistill.tuples.labels import DOCLAYNET_TO_PUBLAYNET, PUBLAYNET_CLASSES
from gsdistill.tuples.store.reader import read_pages

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def patch_labels(page: dict, size: int, patch: int) -> np.ndarray:
    """Class index (0 = background, 1.. = PUBLAYNET_CLASSES) of the box under each patch centre."""
    g = size // patch
    centres = (np.arange(g) + 0.5) * patch / size
    labels = np.zeros((g, g), dtype=np.int64)
    # smaller boxes last, so a title inside a larger text region keeps its own class
    boxes = sorted(page["boxes"], key=lambda b: -(b["bbox"][2] - b["bbox"][0]) * (b["bbox"][3] - b["bbox"][1]))
    for box in boxes:
        name = DOCLAYNET_TO_PUBLAYNET.get(box["category"])
        if name is None:
            continue
        x0, y0, x1, y1 = box["bbox"]
        xs = (centres >= x0 / page["width"]) & (centres <= x1 / page["width"])
        ys = (centres >= y0 / page["height"]) & (centres <= y1 / page["height"])
        labels[np.ix_(ys, xs)] = PUBLAYNET_CLASSES.index(name) + 1
    return labels.reshape(-1)


def box_labels(boxes: list[tuple[int, list[float]]], width: float, height: float, size: int, patch: int) -> np.ndarray:
    """Class index (0 = background) of the box ``(class index, [x0, y0, x1, y1])`` under each patch centre; smaller
    boxes last, so a title inside a larger text region keeps its own class."""
    g = size // patch
    centres = (np.arange(g) + 0.5) * patch / size
    labels = np.zeros((g, g), dtype=np.int64)
    for cls, (x0, y0, x1, y1) in sorted(boxes, key=lambda b: -(b[1][2] - b[1][0]) * (b[1][3] - b[1][1])):
        xs = (centres >= x0 / width) & (centres <= x1 / width)
        ys = (centres >= y0 / height) & (centres <= y1 / height)
        labels[np.ix_(ys, xs)] = cls
    return labels.reshape(-1)


def load_detect_split(data_yaml: str, split: str, size: int, patch: int, limit: int | None = None):
    """A detection data folder's split (``gsdistill detect convert`` / ``demo --coco``: ``coco/{train,val}.json`` beside
    ``images/``): its images, the patch classes of its own boxes (people's labels: the zones of ``demo --coco``), each
    page's document (the file name's prefix before its last ``_``) and the class names."""
    from PIL import Image

    root = Path(data_yaml).parent
    coco = json.loads((root / "coco" / f"{split}.json").read_text())
    cats = sorted(coco["categories"], key=lambda c: c["id"])
    index = {c["id"]: i + 1 for i, c in enumerate(cats)}
    boxes: dict[int, list] = {}
    for a in coco["annotations"]:
        x, y, w, h = a["bbox"]
        boxes.setdefault(a["image_id"], []).append((index[a["category_id"]], [x, y, x + w, y + h]))
    images, labels, docs = [], [], []
    for im in coco["images"][:limit]:
        img = Image.open(root / "images" / split / im["file_name"]).convert("RGB").resize((size, size))
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        images.append((x - MEAN) / STD)
        labels.append(box_labels(boxes.get(im["id"], []), im["width"], im["height"], size, patch))
        docs.append(Path(im["file_name"]).stem.rsplit("_", 1)[0])
    return torch.stack(images), np.stack(labels), docs, [c["name"] for c in cats]


def load_split(folder: str, size: int, patch: int, limit: int | None = None) -> tuple[torch.Tensor, np.ndarray, list[str]]:
    images, labels, docs = [], [], []
    for page in itertools.islice(read_pages(folder, embeddings=False), limit):
        img = page["image"].convert("RGB").resize((size, size))
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        images.append((x - MEAN) / STD)
        labels.append(patch_labels(page, size, patch))
        docs.append(str(page.get("doc_id") or page["id"]))
    return torch.stack(images), np.stack(labels), docs


@torch.no_grad()
def block_tokens(vit, images: torch.Tensor, batch: int = 16) -> list[torch.Tensor]:
    """Per block, ``[pages, patches, dim]`` tokens (the last one with the final norm, as detection reads it)."""
    out = None
    for i in range(0, len(images), batch):
        feats = vit.forward_intermediates(images[i:i + batch], norm=False, output_fmt="NLC",
                                          intermediates_only=True)
        feats = list(feats[:-1]) + [vit.norm(feats[-1])]  # patch tokens only: timm strips the prefix tokens
        out = [[f] for f in feats] if out is None else [o + [f] for o, f in zip(out, feats)]
    return [torch.cat(o) for o in out]


def pixel_tokens(images: torch.Tensor, patch: int) -> torch.Tensor:
    p = F.unfold(images, kernel_size=patch, stride=patch)  # [B, 3*p*p, L]
    return p.transpose(1, 2)


def subpatch_targets(images: torch.Tensor, patch: int, grid: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Each patch's ink arrangement: grey levels average-pooled to ``grid x grid`` cells, centred and scaled per
    patch (MAE's normalised pixels), ``[pages, patches, grid*grid]``, and which patches hold any (a blank patch has
    no arrangement to keep)."""
    grey = images.mean(1, keepdim=True)
    cells = F.avg_pool2d(grey, patch // grid)  # [B, 1, H/c, W/c]
    t = F.unfold(cells, kernel_size=grid, stride=grid).transpose(1, 2)  # [B, L, grid*grid]
    var = t.var(-1, keepdim=True)
    return (t - t.mean(-1, keepdim=True)) / (var + 1e-2).sqrt(), var[..., 0] > 1e-3


def ridge_r2(x_tr: torch.Tensor, y_tr: torch.Tensor, x_ev: torch.Tensor, y_ev: torch.Tensor,
             lam: float = 1.0) -> tuple[float, torch.Tensor]:
    """Held-out R^2 of a ridge regression (standardised inputs, closed form); also per-row squared errors."""
    mu, sd = x_tr.mean(0), x_tr.std(0).clamp_min(1e-6)
    a, b = ((x_tr - mu) / sd).double(), ((x_ev - mu) / sd).double()
    a1, b1 = torch.cat([a, torch.ones(len(a), 1, dtype=a.dtype)], 1), torch.cat([b, torch.ones(len(b), 1, dtype=b.dtype)], 1)
    w = torch.linalg.solve(a1.T @ a1 + lam * torch.eye(a1.shape[1], dtype=a.dtype), a1.T @ y_tr.double())
    err = (b1 @ w - y_ev.double()).square().sum(1)
    return float(1 - err.sum() / (y_ev.double() - y_tr.double().mean(0)).square().sum()), err


def fit_probe(x: torch.Tensor, y: torch.Tensor, n_cls: int, steps: int = 300, wd: float = 1e-4) -> torch.nn.Linear:
    """Class-balanced softmax regression on standardised features (full batch, L-BFGS)."""
    probe = torch.nn.Linear(x.shape[1], n_cls)
    counts = torch.bincount(y, minlength=n_cls).float().clamp_min(1)
    weight = counts.sum() / (n_cls * counts)
    opt = torch.optim.LBFGS(probe.parameters(), max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(probe(x), y, weight=weight) + wd * probe.weight.square().sum()
        loss.backward()
        return loss
    opt.step(closure)
    return probe


def page_hits(pred: np.ndarray, y: np.ndarray, n_cls: int) -> np.ndarray:
    """``[pages, classes, 2]``: correct and total patches per class per page (for balanced accuracy)."""
    out = np.zeros((len(y), n_cls, 2))
    for c in range(n_cls):
        m = y == c
        out[:, c, 0] = (m & (pred == y)).sum(1)
        out[:, c, 1] = m.sum(1)
    return out


def balanced_acc(hits: np.ndarray) -> float:
    tot = hits.sum(0)
    present = tot[:, 1] > 0
    return float((tot[present, 0] / tot[present, 1]).mean())


def paired_doc_bootstrap(a: np.ndarray, b: np.ndarray, docs: list[str], n_boot: int = 1000, seed: int = 0,
                         stat=None, strata: list[str] | None = None):
    """95 % interval of ``stat(a) - stat(b)`` (default: balanced accuracy) over resampled documents; rows = pages.
    ``strata`` (one per page): documents are drawn within each stratum, as many as it holds."""
    from gsdistill.detect.map_bootstrap import stratified_draw

    stat = stat or balanced_acc
    names = sorted(set(docs))
    idx = [np.array([i for i, d in enumerate(docs) if d == n]) for n in names]
    rng = np.random.default_rng(seed)
    if strata:  # the detection bootstrap's draw: documents within each stratum
        draws = stratified_draw(rng, [strata[i[0]] for i in idx], n_boot)
    else:  # one draw per resample, as this probe always drew (its earlier intervals reproduce)
        draws = (rng.integers(0, len(idx), len(idx)) for _ in range(n_boot))
    diffs = []
    for draw in draws:
        pick = np.concatenate([idx[j] for j in draw])
        diffs.append(stat(a[pick]) - stat(b[pick]))
    return tuple(np.percentile(diffs, [2.5, 97.5]))


def token_stats(tokens: torch.Tensor) -> tuple[float, float]:
    """(effective rank, mean within-page cosine) of ``[pages, patches, dim]`` tokens, centred."""
    x = tokens.double() - tokens.double().reshape(-1, tokens.shape[-1]).mean(0)
    eig = torch.linalg.eigvalsh(torch.cov(x.reshape(-1, x.shape[-1]).T)).clamp_min(0)
    p = eig / eig.sum()
    erank = float(torch.exp(-(p[p > 0] * p[p > 0].log()).sum()))
    u = F.normalize(x, dim=-1)
    gram = u @ u.transpose(1, 2)  # [pages, patches, patches]
    n = x.shape[1]
    within = float(((gram.sum((1, 2)) - n) / (n * (n - 1))).mean())
    return erank, within


def features(name: str, vit, images: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"{name} block {i + 1}": t for i, t in enumerate(block_tokens(vit, images))}


def subpatch_report(xs_tr, xs_ev, docs, patch: int, models: dict) -> None:
    """How much of each patch's own ink arrangement the tokens keep (what a box edge inside a patch needs)."""
    (t_tr, ink_tr), (t_ev, ink_ev) = subpatch_targets(xs_tr, patch), subpatch_targets(xs_ev, patch)
    y_tr, y_ev = t_tr[ink_tr], t_ev[ink_ev]
    print(f"inked patches: {len(y_tr)} training, {len(y_ev)} held-out; held-out R^2 of the 4 x 4 arrangement")
    page = torch.arange(len(xs_ev))[:, None].expand_as(ink_ev)[ink_ev].numpy()
    errs = {}
    sources = {"pixels": (pixel_tokens(xs_tr, patch)[ink_tr], pixel_tokens(xs_ev, patch)[ink_ev])}
    for name, vit in models.items():
        tr, ev = features(name, vit, xs_tr), features(name, vit, xs_ev)
        sources.update({k: (tr[k][ink_tr], ev[k][ink_ev]) for k in tr})
    for key, (tr, ev) in sources.items():
        r2, errs[key] = ridge_r2(tr, y_tr, ev, y_ev)
        print(f"{key:22s} R^2 {r2:.3f}", flush=True)
    n_pages = len(xs_ev)
    count = np.bincount(page, minlength=n_pages)

    def per_page(err: torch.Tensor) -> np.ndarray:  # rows = pages: (summed error, inked patches)
        return np.stack([np.bincount(page, err.numpy(), n_pages), count], 1)

    def mean_error(rows: np.ndarray) -> float:
        return rows[:, 0].sum() / max(rows[:, 1].sum(), 1)

    for key in [k for k in errs if k.startswith("pretrained")]:
        # paired over documents: random's mean error per patch - pretrained's (above 0: pretrained keeps more)
        a, b = per_page(errs[key.replace("pretrained", "random")]), per_page(errs[key])
        lo, hi = paired_doc_bootstrap(a, b, docs, stat=mean_error)
        print(f"{key}: random's error - pretrained's per patch {mean_error(a) - mean_error(b):+.3f} [{lo:+.3f}, {hi:+.3f}]")

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", help="shard folder of the training pages (their boxes: the PDF builder's classes)")
    ap.add_argument("--eval", help="shard folder of the held-out pages")
    ap.add_argument("--detect-data", help="instead of --train/--eval: a detection data YAML (its train and val splits, "
                    "its own classes: the zones people drew, for `demo --coco`); intervals resample held-out pages "
                    "within each held-out document")
    ap.add_argument("--backbone", required=True, nargs="+",
                    help="exported backbone folder(s) (backbone.json); probes use the first")
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--seed", type=int, default=0, help="random twin's init seed")
    ap.add_argument("--train-pages", type=int, default=None, help="fit the probes on the first N training pages")
    ap.add_argument("--eval-pages", type=int, default=None, help="score on the first N held-out pages")
    ap.add_argument("--stats-only", action="store_true", help="token statistics per block, no probes")
    ap.add_argument("--subpatch", action="store_true",
                    help="ridge-regress each inked patch's 4 x 4 ink arrangement from the tokens (held-out R^2), no class probes")
    ap.add_argument("--out", default="runs/probe_layout")
    args = ap.parse_args()
    torch.manual_seed(0)
    meta = read_backbone_meta(args.backbone[0])
    patch, n_cls, class_names = 16, len(PUBLAYNET_CLASSES) + 1, PUBLAYNET_CLASSES
    if not args.detect_data and not (args.train and args.eval):
        ap.error("give --train and --eval, or --detect-data")
    pre = load_backbone(args.backbone[0]).eval()
    torch.manual_seed(args.seed)
    rnd = create_backbone({"name": meta["model_name"], **{k: v for k, v in meta["kwargs"].items()
                                                          if k != "dynamic_img_size"}}).eval()
    strata = None
    if args.detect_data:
        xs_tr, y_tr, _, class_names = load_detect_split(args.detect_data, "train", args.size, patch, args.train_pages)
        xs_ev, y_ev, books, _ = load_detect_split(args.detect_data, "val", args.size, patch, args.eval_pages)
        docs, strata, n_cls = [f"page{i}" for i in range(len(books))], books, len(class_names) + 1
    if args.stats_only:
        if not args.detect_data:
            xs_ev, _, _ = load_split(args.eval, args.size, patch, args.eval_pages)
        models = {"random twin": rnd, **{str(b): load_backbone(b).eval() for b in args.backbone}}
        print(f"{len(xs_ev)} held-out pages at {args.size} px: effective rank / within-page cosine per block")
        for name, vit in models.items():
            stats = [token_stats(t) for t in block_tokens(vit, xs_ev)]
            print(f"{name}: " + "  ".join(f"block {i + 1} {r:.1f} / {c:.3f}" for i, (r, c) in enumerate(stats)))
        return
    if not args.detect_data:
        xs_tr, y_tr, _ = load_split(args.train, args.size, patch, args.train_pages)
        xs_ev, y_ev, docs = load_split(args.eval, args.size, patch, args.eval_pages)
    if args.subpatch:
        subpatch_report(xs_tr, xs_ev, docs, patch, {"pretrained": pre, "random": rnd})
        return
    print(f"{len(xs_tr)} training pages, {len(xs_ev)} held-out pages of {len(set(strata or docs))} documents; "
          f"patch classes (held-out): {np.bincount(y_ev.reshape(-1), minlength=n_cls).tolist()}")
    rows, hits = [], {}
    sources = {"pixels": (pixel_tokens(xs_tr, patch), pixel_tokens(xs_ev, patch))}
    for name, vit in (("pretrained", pre), ("random", rnd)):
        tr, ev = features(name, vit, xs_tr), features(name, vit, xs_ev)
        sources.update({k: (tr[k], ev[k]) for k in tr})
    for key, (tr, ev) in sources.items():
        x = tr.reshape(-1, tr.shape[-1])
        mu, sd = x.mean(0), x.std(0).clamp_min(1e-6)
        probe = fit_probe((x - mu) / sd, torch.from_numpy(y_tr.reshape(-1)), n_cls)
        with torch.no_grad():
            pred = probe((ev.reshape(-1, ev.shape[-1]) - mu) / sd).argmax(1).numpy().reshape(y_ev.shape)
        hits[key] = page_hits(pred, y_ev, n_cls)
        rows.append({"features": key, "balanced_acc": round(balanced_acc(hits[key]), 4)})
        tot = hits[key].sum(0)
        per_class = " ".join(f"{n} {c / t:.2f}" for n, (c, t) in zip(["background", *class_names], tot) if t)
        print(f"{key:22s} balanced accuracy {rows[-1]['balanced_acc']:.3f}  ({per_class})", flush=True)
    for key in [k for k in hits if k.startswith("pretrained")]:
        twin = key.replace("pretrained", "random")
        lo, hi = paired_doc_bootstrap(hits[key], hits[twin], docs, strata=strata)
        d = balanced_acc(hits[key]) - balanced_acc(hits[twin])
        print(f"{key} - random: {d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        rows.append({"features": f"{key} - random", "balanced_acc": round(d, 4), "lo": round(lo, 4), "hi": round(hi, 4)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["features", "balanced_acc", "lo", "hi"])
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out / 'probe.csv'}")


if __name__ == "__main__":
    main()
