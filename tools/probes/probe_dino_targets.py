"""Why does DINO sit at log K? The EMA teacher's targets on held-out pages, measured on a finished run.

    python tools/probes/probe_dino_targets.py --run runs/real_pages_bench/pretrain --pages runs/real_pages_bench/data/eval \
        [--n 128] [--out probe.json]

DINO's loss is the cross-entropy between the teacher's Sinkhorn-Knopp targets on one view and the
student's prediction from another; it stays at log K when the targets are uniform (the teacher's
prototype logits hardly differ between pages, against its temperature) or when a target cannot be
predicted from another view of the same page. Two augmented global views of each page go through the
run's own view pipeline (``views`` of its saved config); targets are computed over batches of the
run's ``optim.batch_size``, as in training. Printed (and written with ``--out``), teacher side:

- ``teacher_logit_std_over_pages`` and its ratio to the teacher temperature;
- ``input_cosine`` / ``bottleneck_cosine``: mean pairwise cosine between pages of the pooled embedding
  the DINO head reads and of its MLP output before the l2 normalisation (1.0: every page one point);
- ``target_entropy`` (log K = uniform) and ``target_max_prob``;
- ``argmax_agree_same_page`` / ``argmax_agree_other_page``: the two views' top prototypes agree, for
  the same page and for another page (chance 1 / K);
- ``student_entropy`` and ``dino_ce``: the student's prediction from view 1 against view 2's target.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import torch

from gsdistill.pipelines.demo_learning import head_spread


def entropy(p: torch.Tensor) -> float:
    return float(-(p * p.clamp_min(1e-30).log()).sum(-1).mean())


@torch.no_grad()
def dino_target_stats(model, views, pages: list[dict], batch_size: int) -> dict:
    """The numbers of the module docstring for ``model`` (a GSDistill with self-distillation) on ``pages``."""
    from gsdistill.models.view_batch import normalize_crops
    from gsdistill.models.vit_encoder import encode_views

    if not hasattr(model, "teacher"):
        raise ValueError("the run has no EMA teacher: objective.distill and objective.ibot are both off")
    if len(pages) < 2 * batch_size:
        raise ValueError(f"need at least {2 * batch_size} pages (two batches of {batch_size}), got {len(pages)}")
    backbone, head = model.teacher["backbone"], model.teacher["dino_head"]
    pooled, t_logits, s_logits = [], [[], []], []  # pooled and student: view 1; teacher logits: both views
    for start in range(0, len(pages) - batch_size + 1, batch_size):
        samples = [views(p) for p in pages[start:start + batch_size]]
        for v in range(2):
            x = normalize_crops(torch.stack([s["global_crops"][v] for s in samples]))
            h = encode_views(backbone, x)[0]
            t_logits[v].append(head(h).float())
            if v == 0:
                pooled.append(h)
                s_logits.append(model.dino_head(encode_views(model.backbone, x)[0]).float())
    temp = float(model.current_teacher_temp())
    # the training's own targets (centering, temperature at the last step, logit bound), batch by batch
    targets = [torch.cat([model._teacher_targets(t, model.dino_loss) for t in tv]) for tv in t_logits]
    log_p = torch.log_softmax(torch.cat(s_logits) / model.dino_loss.student_temp, -1)
    spread = head_spread(torch.cat(pooled), head, temp)
    top = [t.argmax(-1) for t in targets]
    other = torch.roll(torch.arange(len(top[0])), 1)
    K = targets[0].shape[1]
    return {"pages": spread["pages"], "K": int(K), "log_K": math.log(K), "teacher_temp": temp,
            "teacher_logit_std_over_pages": spread["std_over_pages"], "ratio_to_temp": spread["ratio"],
            "input_cosine": spread["input_cosine"], "bottleneck_cosine": spread["bottleneck_cosine"],
            "target_entropy": entropy(targets[0]), "target_max_prob": float(targets[0].max(-1).values.mean()),
            "argmax_agree_same_page": float((top[0] == top[1]).float().mean()),
            "argmax_agree_other_page": float((top[0] == top[1][other]).float().mean()),
            "student_entropy": entropy(log_p.exp()), "dino_ce": float(-(targets[1] * log_p).sum(-1).mean())}


def main(argv: list[str] | None = None) -> dict:
    from gsdistill.pretrain.checkpoint import load_pretrained, read_config, resolve_checkpoint
    from gsdistill.tuples.store.reader import read_pages
    from gsdistill.views.multicrop import MultiCropViews

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="pretraining run dir or checkpoint folder")
    ap.add_argument("--pages", required=True, help="folder of page-tuple shards (held-out pages)")
    ap.add_argument("--n", type=int, default=128, help="pages to read (whole batches of optim.batch_size are used)")
    ap.add_argument("--seed", type=int, default=7, help="seed of the views")
    ap.add_argument("--out", help="write the numbers as JSON here")
    args = ap.parse_args(argv)
    cfg = read_config(resolve_checkpoint(args.run))
    model = load_pretrained(args.run)
    views = MultiCropViews.from_config(cfg.views, int(model.backbone.patch_embed.patch_size[0]), seed=args.seed)
    pages = list(itertools.islice(read_pages(Path(args.pages)), args.n))
    stats = {"run": str(args.run), **dino_target_stats(model, views, pages, int(cfg.optim.batch_size))}
    text = json.dumps(stats, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return stats


if __name__ == "__main__":
    main()
