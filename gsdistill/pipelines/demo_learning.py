"""What the demo's pretraining learned, measured against controls trained or drawn in the same run.

Models compared on the same pages:

- ``pretrained``: the GSDistill run of the demo;
- ``random backbone, heads trained``: the same objective, steps and data with the backbone frozen
  at its random initialisation, so the heads learn what a random feature map allows (the control
  that tells a learned backbone from learned heads);
- ``random (untrained)``: the architecture at initialisation (chance by construction, a sanity
  floor for the numbers).

For each model, split (training pages, held-out pages) and head, :func:`head_retrieval` gives Acc@1
with a document-level bootstrap interval and the page embedding's effective rank. A model pretrained
with span-centred local views (``views.local_mode: spans``) gets one more row, ``sem_crops``: the
same 5-text semantic queries against galleries of span-centred crops at the local views' resolution
(:func:`gsdistill.eval.span_crop_retrieval.span_crop_retrieval`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gsdistill.eval.head_retrieval import bootstrap_by_document, head_retrieval
from gsdistill.eval.span_crop_retrieval import span_crop_retrieval

HEAD_QUERIES = (("geom", None), ("sem", 1), ("sem", 5), ("sem", 8))
SPAN_CROP_K = 5  # texts per query of the span-crop gallery row


def untrained_model(run_dir: Path, seed: int):
    """The run's architecture with fresh random weights (its own config, another seed)."""
    from omegaconf import OmegaConf
    from gsdistill.models.gsdistill_model import GSDistill
    cfg = OmegaConf.load(Path(run_dir) / "config.yaml")
    torch.manual_seed(seed)
    return GSDistill(cfg).eval()


def _row(label: str, split: str, head: str, k, r: dict) -> dict:
    return {"model": label, "split": split, "head": head, "k": "all" if k is None else k,
            "acc1": r["acc1"], "ci95": r["ci95"], "r5": r["r5"], "mrr": r["mrr"],
            "chance": r["chance"], "n_pages": r["n_pages"], "n_docs": r["n_docs"],
            "effective_rank": r["spread"]["effective_rank"], "hits": r["hits"]}


def measure(models: dict, splits: dict[str, list[dict]], image_size: int, seed: int = 0,
            device: str = "cpu") -> list[dict]:
    """One row per (model, split, head, k): Acc@1, its document-bootstrap interval, chance, rank;
    head ``sem_crops`` (with ``gallery``, its crops in words) for models pretrained on span-centred views."""
    rows = []
    for label, model in models.items():
        for split, pages in splits.items():
            for head, k in HEAD_QUERIES:
                r = head_retrieval(model, pages, head, image_size, k=k, seed=seed, device=device)
                rows.append(_row(label, split, head, k, r))
            if getattr(model, "span_crop_view", None) is not None:
                r = span_crop_retrieval(model, pages, k=SPAN_CROP_K, seed=seed, device=device)
                rows.append({**_row(label, split, "sem_crops", SPAN_CROP_K, r), "gallery": (
                    f"up to {r['max_crops']} crops of {r['span_px']} page px at {r['crop_size']} px, "
                    f"{r['crops_per_page']:.1f} a page; {r['aggregation']} over texts of the best crop")})
    return rows


def paired_gain(rows: list[dict], a: str, b: str, split: str, head: str, k, n_boot: int = 2000,
                seed: int = 0, doc_of: list[str] | None = None) -> dict | None:
    """Acc@1 of model ``b`` minus model ``a`` on the same pages, with a bootstrap interval over pages'
    documents (``doc_of``: the document of each page, in the rows' page order)."""
    pick = {r["model"]: r for r in rows if r["split"] == split and r["head"] == head and r["k"] == k}
    if a not in pick or b not in pick:
        return None
    diff = np.asarray(pick[b]["hits"]) - np.asarray(pick[a]["hits"])
    lo, hi = bootstrap_by_document(diff, doc_of or [str(i) for i in range(len(diff))], n_boot, seed)
    return {"diff": float(diff.mean()), "ci95": [lo, hi]}


def _pct(v: float) -> str:
    return f"{100 * v:.1f}"


def retrieval_markdown(rows: list[dict], split: str, text_note: str | None = None) -> str:
    """Acc@1 [95% CI] per model (columns) and head/k (rows) on one split, with chance and rank;
    ``text_note`` (e.g. the text height in view pixels) is printed next to every semantic row."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    keys = list(dict.fromkeys((r["head"], r["k"]) for r in rows if r["split"] == split))
    cell = {(r["model"], r["head"], r["k"]): r for r in rows if r["split"] == split}
    lines = ["| query → page | chance | " + " | ".join(models) + " |", "|---|---:|" + "---:|" * len(models)]
    for head, k in keys:
        any_row = next(cell[m, head, k] for m in models if (m, head, k) in cell)
        what = "geometric: all box descriptors" if head == "geom" else f"semantic: {k} text crop(s)"
        if head == "sem" and text_note:
            what += f" ({text_note})"
        if head == "sem_crops":
            what += f", span-crop gallery ({any_row['gallery']})"
        vals = []
        for m in models:
            r = cell.get((m, head, k))
            vals.append("–" if r is None else f"{_pct(r['acc1'])} [{_pct(r['ci95'][0])}, {_pct(r['ci95'][1])}]")
        lines.append(f"| {what} | {_pct(any_row['chance'])} | " + " | ".join(vals) + " |")
    ranks = []
    for m in models:
        r = [cell[m, h, k] for h, k in keys if (m, h, k) in cell and h == "geom"]
        s = [cell[m, h, k] for h, k in keys if (m, h, k) in cell and h == "sem"]
        ranks.append(f"{r[0]['effective_rank']:.1f} / {s[0]['effective_rank']:.1f}" if r and s else "–")
    lines.append("| effective rank of page embeddings (geom / sem) | | " + " | ".join(ranks) + " |")
    return "\n".join(lines)


def mean_pairwise_cosine(x: torch.Tensor) -> float:
    """Mean cosine between the rows of ``x [N, D]`` over the N (N - 1) ordered pairs of different rows."""
    unit = torch.nn.functional.normalize(x.float(), dim=1)
    n = len(unit)
    return float(((unit @ unit.T).sum() - n) / (n * (n - 1)))


@torch.no_grad()
def head_spread(pooled: torch.Tensor, head, teacher_temp: float) -> dict:
    """How far apart a DINO head keeps pages: ``pooled [N, C]`` page embeddings -> the std over pages of its
    prototype logits (mean over prototypes), its ratio to ``teacher_temp``, and mean pairwise cosines of
    the logits, of the head's input and of its bottleneck output before the l2 normalisation."""
    logits = head(pooled).float()
    spread = float(logits.std(dim=0).mean())
    return {"std_over_pages": spread, "teacher_temp": float(teacher_temp), "ratio": spread / float(teacher_temp),
            "mean_pairwise_cosine": mean_pairwise_cosine(logits), "input_cosine": mean_pairwise_cosine(pooled),
            "bottleneck_cosine": mean_pairwise_cosine(head.mlp(pooled)), "pages": len(pooled)}


@torch.no_grad()
def teacher_logit_spread(model, pages: list[dict], image_size: int, batch_size: int = 32) -> dict | None:
    """Why DINO sits at log K, measured: the EMA teacher's prototype logits on whole-page views.

    Sinkhorn-Knopp turns ``exp(logits / T)`` into balanced targets; when every page gives nearly the
    same logits (their std over pages, per prototype, far below the teacher temperature ``T``) the
    targets are uniform and DINO's cross-entropy is log K whatever the student does. Returns the
    std over pages averaged over prototypes, its ratio to ``T`` and the mean pairwise cosine of the
    pages' logit vectors, and where the pages merge: the mean pairwise cosine of the pooled page
    embeddings the head reads (``input_cosine``) and of the head's bottleneck output before its
    l2 normalisation (``bottleneck_cosine``; 1.0 = the head sends every page to one point); None for a
    model without self-distillation.
    """
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    from gsdistill.eval.page_gallery import _image_tensor
    from gsdistill.models.vit_encoder import encode_views

    if not getattr(model, "use_distill", False) or len(pages) < 2:
        return None
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
    backbone, head = model.teacher["backbone"], model.teacher["dino_head"]
    pooled = []
    for start in range(0, len(pages), batch_size):
        x = torch.stack([_image_tensor(p["image"], image_size) for p in pages[start:start + batch_size]]).float() / 255.0
        pooled.append(encode_views(backbone, (x - mean) / std)[0])
    return head_spread(torch.cat(pooled), head, model.teacher_temp)
