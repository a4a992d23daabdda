"""Same head, same budget, same held-out pages: does the pretrained backbone beat a random one?

:func:`compare_backbones` trains the detector of ``cfg`` (frozen ViT -> simple feature pyramid ->
YOLOv10 head) once per (backbone, seed) with Ultralytics' trainer, and scores ``last.pt`` on the
data's ``val`` split (pages of documents never trained on) with pycocotools. A backbone is

- a folder from ``gsdistill export`` (pretrained),
- ``None``: a random ViT of the same architecture as the first exported folder given (or of
  ``cfg.random_backbone`` when none is), initialised from the row's seed, or
- an Ultralytics model YAML name such as ``"yolov10n.yaml"``: that stock model trained fully from
  scratch (no weights are downloaded) at the same epochs / imgsz / batch / lr, as a reference column.

Every row is trained with the same config (``configs/detect/compare.yaml`` by default: no
augmentation, one optimizer step per batch) and evaluated on ``last.pt``, so no row picks its
checkpoint on the held-out pages. :func:`summarize` gives mean and sample std (ddof=1) per backbone.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Iterable

from omegaconf import DictConfig

from gsdistill.config import load_config, to_dict


def _data_yaml(data, out: Path, seed: int) -> Path:
    """A data YAML as given, or one written from page tuples (split by document, 25 % held out)."""
    if isinstance(data, (str, Path)):
        return Path(data)
    from gsdistill.detect.convert import pages_to_yolo
    return pages_to_yolo(data, out / "data", val_fraction=0.25, seed=seed)


def random_twin(reference: str | Path | None, cfg: DictConfig, out: Path, seed: int) -> Path:
    """An exported random ViT: ``reference``'s architecture (or ``cfg.random_backbone``), init seeded by ``seed``."""
    import torch

    from gsdistill.detect.backbone_folder import read_backbone_folder
    from gsdistill.models.backbone import create_backbone, save_backbone

    if reference is not None:
        meta = read_backbone_folder(reference)
        spec = {"name": meta["model_name"], **{k: v for k, v in meta["kwargs"].items() if k != "dynamic_img_size"}}
    else:
        spec = to_dict(cfg.random_backbone)
    torch.manual_seed(seed)
    return save_backbone(create_backbone(spec), spec, out, extra={"source": f"random init (seed {seed})"})


def _train_stock(model_yaml: str, cfg: DictConfig, data: Path, run_dir: Path) -> Path:
    """An Ultralytics stock model (e.g. yolov10n.yaml) trained fully from scratch with ``cfg``'s budget."""
    from ultralytics import YOLO

    from gsdistill.detect.pipeline import check_training_data, record_data_check, train_args
    from gsdistill.detect.run_logging import add_run_callbacks

    report = check_training_data(cfg)  # the same readable pages as the ViT rows
    run_dir.mkdir(parents=True, exist_ok=True)
    data = record_data_check(report, data, run_dir)
    yolo = YOLO(model_yaml, task="detect")  # architecture only: random init, nothing downloaded
    add_run_callbacks(yolo, run_dir)
    args = train_args(cfg, str(data), run_dir)
    args.update(freeze=None, pretrained=False)
    yolo.train(**args)
    return run_dir


def _one_row(name: str, spec, reference, data: Path, cfg: DictConfig, out: Path, seed: int) -> dict:
    from gsdistill.detect.evaluate import validate
    from gsdistill.detect.pipeline import train_head

    run_cfg = cfg.copy()
    run_cfg.seed, run_cfg.data, run_cfg.project, run_cfg.name = seed, str(data), str(out / "runs"), f"{name}_s{seed}"
    t0, cpu0 = time.time(), time.process_time()  # CPU seconds: the budget on a shared machine (workers=0)
    if isinstance(spec, str) and spec.endswith((".yaml", ".yml")) and not Path(spec).is_dir():
        run_dir = _train_stock(spec, run_cfg, data, out / "runs" / run_cfg.name)
        frozen = False
    else:
        backbone = spec if spec is not None else random_twin(reference, cfg, out / "backbones" / f"{name}_s{seed}", seed)
        run_cfg.backbone = str(backbone)
        run_dir = train_head(run_cfg)
        frozen = bool(run_cfg.frozen)
    train_s = time.time() - t0
    val_cfg = run_cfg.copy()
    val_cfg.project = str(out / "val")
    report = validate(run_dir / "weights" / "last.pt", data, cfg=val_cfg)
    run = json.loads((run_dir / "report.json").read_text())
    params = json.loads((run_dir / "params.json").read_text())
    return {"backbone": name, "seed": seed, "map50": report["coco_mAP50"], "map50_95": report["coco_mAP50-95"],
            "ul_map50": report["mAP50"], "ul_map50_95": report["mAP50-95"],
            "optimizer_steps": run["optimizer_steps"], "epochs": run["epochs_done"], "imgsz": report["imgsz"],
            "trainable_params": params["params_trainable"], "total_params": params["params_total"],
            "frozen_backbone": frozen, "train_s": round(train_s, 1), "wall_s": round(time.time() - t0, 1),
            "cpu_s": round(time.process_time() - cpu0, 1),
            "run_dir": str(run_dir), "val_dir": report["save_dir"]}


def compare_backbones(data, backbones: dict[str, str | Path | None], seeds: Iterable[int] = (0, 1),
                      cfg: DictConfig | None = None, out_dir: str | Path = "runs/compare_backbones",
                      reference: str | Path | None = None) -> list[dict]:
    """Train and score one detector per (backbone, seed); return one row each.

    Args:
        data: an Ultralytics data YAML (from ``gsdistill detect convert``; its ``val`` split is the
            held-out set), or an iterable of page tuples (written to ``out_dir/data``, split by document).
        backbones: display name -> exported backbone folder | None (random twin) | Ultralytics model YAML.
        seeds: training seeds (and random-twin init seeds); >= 2 for a spread.
        cfg: detect config (``load_config("detect", "compare", [...])``); every row uses it unchanged.
        out_dir: data, random backbones, runs and val reports go here.
        reference: the exported folder whose architecture random twins copy; default the first
            exported folder in ``backbones`` (give it when the pretrained row runs elsewhere).

    Returns:
        rows ``{backbone, seed, map50, map50_95 (pycocotools, fractions), ul_map50, ul_map50_95 (Ultralytics),
        optimizer_steps, epochs, imgsz, trainable_params, total_params, frozen_backbone, train_s, wall_s,
        cpu_s (this process's CPU seconds, train + val: the budget on a shared machine), run_dir, val_dir
        (holds the val split's ``predictions.json``, for :mod:`gsdistill.detect.map_bootstrap`)}``, in
        the order seeds x backbones. Also written to ``out_dir/rows.json`` after every row.
    """
    cfg = cfg if cfg is not None else load_config("detect", "compare")
    out = Path(out_dir).resolve()
    seeds = [int(s) for s in seeds]
    data_yaml = _data_yaml(data, out, seeds[0] if seeds else 0)
    exported = [v for v in backbones.values() if v is not None and not str(v).endswith((".yaml", ".yml"))]
    reference = reference if reference is not None else (exported[0] if exported else None)
    rows = []
    for seed in seeds:  # seed-major: a run cut short still holds every backbone of its first seeds
        for name, spec in backbones.items():
            rows.append(_one_row(name, spec, reference, data_yaml, cfg, out, seed))
            (out / "rows.json").write_text(json.dumps(rows, indent=1))
    return rows


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1; None for a single value)."""
    n = len(values)
    mean = sum(values) / n
    return mean, (math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None)


def summarize(rows: list[dict]) -> list[dict]:
    """Per backbone: n seeds, mean and sample std (ddof=1) of map50 / map50_95, mean steps and seconds."""
    out = []
    for name in dict.fromkeys(r["backbone"] for r in rows):
        group = [r for r in rows if r["backbone"] == name]
        m50, s50 = _mean_std([r["map50"] for r in group])
        m95, s95 = _mean_std([r["map50_95"] for r in group])
        out.append({"backbone": name, "n": len(group), "map50_mean": m50, "map50_std": s50, "map50_95_mean": m95,
                    "map50_95_std": s95, "optimizer_steps": group[0]["optimizer_steps"],
                    "trainable_params": group[0]["trainable_params"],
                    "wall_s_mean": sum(r["wall_s"] for r in group) / len(group),
                    "cpu_s_mean": sum(r.get("cpu_s", r["wall_s"]) for r in group) / len(group)})
    return out


def markdown_table(summary: list[dict]) -> str:
    """The summary as a markdown table, mAP in percent as ``mean ± std``."""
    def pm(mean, std):
        return f"{100 * mean:.2f}" + ("" if std is None else f" ± {100 * std:.2f}")
    lines = ["| backbone | seeds | mAP@50 (%) | mAP@[50:95] (%) | optimizer steps | trainable params (M) | "
             "wall s / run | CPU s / run |", "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['backbone']} | {s['n']} | {pm(s['map50_mean'], s['map50_std'])} | "
                     f"{pm(s['map50_95_mean'], s['map50_95_std'])} | {s['optimizer_steps']} | "
                     f"{s['trainable_params'] / 1e6:.2f} | {s['wall_s_mean']:.0f} | {s['cpu_s_mean']:.0f} |")
    return "\n".join(lines)
