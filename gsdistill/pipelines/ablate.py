"""``gsdistill ablate``: the rows of paper 003 Table 3 and Table A1, end to end.

Per row and pretraining seed: ``run_pretraining`` on the row's experiment file, then the ablation
config's ``pretrain`` section (the shared scale) -> export -> head-only YOLOv10 fine-tuning of the
frozen backbone on one fixed small detection set -> detection val (mAP@50, mAP@50-95) -> 1-crop
page retrieval (Acc@1) on held-out pages. Each finished (row, seed) is appended to ``results.csv`` at once, so an
interrupted run continues where it stopped; ``table.md`` and ``ablation.png`` are rewritten from
the CSV after every row.

The ablation config's ``pretrain``, ``detect`` and ``eval`` sections hold keys of those stages'
configs; ``load_config`` checks them against each stage's defaults and applies them to every row
(``load_config(stage, ..., layers=[section])``).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

from gsdistill.run_log import append_row, bar_plot, read_rows

FIELDS = ["label", "table", "experiment", "seed", "det_mAP50", "det_mAP50-95", "retrieval_acc1",
          "retrieval_mrr", "n_gallery", "geom_acc1", "geom_chance", "pretrain_s", "detect_s", "retrieval_s",
          "run_dir", "detect_dir"]
RANDOM = "random"  # the reference row: no pretraining, a random backbone of the rows' architecture


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def settings(section, prefix: str = "") -> list[str]:
    """``key=value`` for every value an embedded stage section sets (for the table's scale line)."""
    out = []
    for key, value in section.items():
        if hasattr(value, "items"):
            out += settings(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={value}")
    return out


def select_rows(rows: list[dict], wanted: list[str] | None) -> list[dict]:
    """Rows whose label or experiment is in ``wanted`` (all when None); unknown names are errors."""
    if not wanted:
        return rows
    known = {r["label"]: r for r in rows} | {r["experiment"]: r for r in rows}
    missing = [w for w in wanted if w not in known]
    if missing:
        raise ValueError(f"unknown ablation row(s) {missing}; known experiments: "
                         f"{', '.join(r['experiment'] for r in rows)}")
    return list({id(known[w]): known[w] for w in wanted}.values())


def read_results(path: Path) -> list[dict]:
    """The finished (row, seed) results of ``results.csv``; [] before the first."""
    return read_rows(path) if path.is_file() else []


def _append(path: Path, row: dict) -> None:
    append_row(path, {k: row.get(k, "") for k in FIELDS}, FIELDS)


def detection_set(cfg, out_dir: Path) -> Path:
    """The fixed detection data YAML: the configured one, or synthetic pages converted once."""
    if cfg.detect_set.data:
        return Path(cfg.detect_set.data)
    data_yaml = out_dir / "detect_data" / "data.yaml"
    if not data_yaml.is_file():
        from gsdistill.tuples.sources.synthetic import generate_pages
        from gsdistill.detect.convert import pages_to_yolo
        pages = generate_pages(int(cfg.detect_set.synthetic_pages), seed=int(cfg.detect_set.synthetic_seed))
        data_yaml = Path(pages_to_yolo(pages, out_dir / "detect_data", val_fraction=0.25, seed=0))
    return data_yaml


def retrieval_pages(cfg) -> tuple[list[dict] | None, Path | None]:
    """Held-out pages: (None, shard dir) when configured, else (synthetic pages in memory, None)."""
    if cfg.held_out.pages:
        return None, Path(cfg.held_out.pages)
    from gsdistill.tuples.sources.synthetic import generate_pages
    return list(generate_pages(int(cfg.held_out.synthetic_pages), seed=int(cfg.held_out.synthetic_seed))), None


def geometric_pages(cfg, out_dir: Path, descriptor_format: str) -> list[dict]:
    """Held-out pages with cached descriptor embeddings in ``descriptor_format`` (built once per format)."""
    from gsdistill.tuples.store.reader import read_pages
    from gsdistill.tuples.store.writer import write_shards
    from gsdistill.models.text_encoder import DEFAULT_ENCODER, TextEncoder
    from gsdistill.tuples.embedding.stage import embed_shards
    from gsdistill.tuples.store.text_cache import open_embeddings
    folder = Path(cfg.held_out.pages) if cfg.held_out.pages else out_dir / "retrieval_data"
    if not cfg.held_out.pages and not (folder / "manifest.json").is_file():
        from gsdistill.tuples.sources.synthetic import generate_pages
        write_shards(generate_pages(int(cfg.held_out.synthetic_pages), seed=int(cfg.held_out.synthetic_seed)), folder)
    embed_shards(folder, TextEncoder, DEFAULT_ENCODER, descriptor_format=descriptor_format, progress=False)
    return list(read_pages(folder, embeddings=open_embeddings(folder, required=True, descriptor_format=descriptor_format)))


def random_reference(cfg, seed: int, out_dir: Path):
    """The untrained GSDistill model of the rows' architecture and its exported random backbone."""
    import torch

    from gsdistill.config import load_config
    from gsdistill.models.gsdistill_model import GSDistill
    from gsdistill.pretrain.run import export_backbone
    full = [r.experiment for r in cfg.rows if r.experiment != RANDOM][-1]  # the full objective's architecture
    pre_cfg = load_config("pretrain", full, [f"train.seed={seed}"], layers=[cfg.pretrain])
    torch.manual_seed(seed)
    model = GSDistill(pre_cfg).eval()
    folder = export_backbone(model.state_dict(), pre_cfg, out_dir / "pretrain" / f"{RANDOM}-s{seed}" / "backbone")
    return model, folder, pre_cfg


def run_row(row: dict, seed: int, cfg, out_dir: Path, data_yaml: Path, eval_pages) -> dict:
    """Pretrain, fine-tune the detection head, validate, and score 1-crop and geometric retrieval for
    one row; the ``random`` row skips pretraining (same head, same detection budget)."""
    from gsdistill.config import load_config
    from gsdistill.detect.pipeline import train_head, validate
    from gsdistill.eval import splits
    from gsdistill.pretrain.run_folder import pretrain_shards, run_config
    from gsdistill.eval.page_retrieval import evaluate_page_retrieval
    from gsdistill.pretrain.checkpoint import load_pretrained
    from gsdistill.pretrain.run import run_pretraining

    from gsdistill.eval.head_retrieval import head_retrieval

    name = f"{slug(row['experiment'])}-s{seed}"
    t0 = time.perf_counter()
    if row["experiment"] == RANDOM:
        model, backbone, pre_cfg = random_reference(cfg, seed, out_dir)
        run_dir = backbone.parent
    else:
        pre_cfg = load_config("pretrain", row["experiment"], [f"train.seed={seed}"], layers=[cfg.pretrain])
        # a row runs only while missing from results.csv: a folder left there is this row's own unfinished try
        run_dir = Path(run_pretraining(pre_cfg, out_dir / "pretrain" / name, overwrite=True))
        model, backbone = load_pretrained(run_dir), run_dir / "backbone"
    t1 = time.perf_counter()
    det_cfg = load_config("detect", None, [f"backbone={backbone}", f"data={data_yaml}",
                                           f"project={out_dir / 'detect'}", f"name={name}", f"seed={seed}"],
                          layers=[cfg.detect])
    det_dir = Path(train_head(det_cfg))
    det = validate(det_dir / "weights" / "best.pt", data_yaml, cfg=det_cfg)
    t2 = time.perf_counter()
    pages, shard_dir = eval_pages
    if shard_dir is not None:
        from gsdistill.tuples.store.reader import ShardDataset
        pages = ShardDataset(shard_dir)
        eval_docs = splits.document_ids(shard_dir)
    else:
        eval_docs = {splits.page_doc_id(p) for p in pages}
    train_shards = pretrain_shards(run_dir, run_config(run_dir)) if row["experiment"] != RANDOM else None
    if train_shards is not None:
        splits.check_held_out(eval_docs, splits.document_ids(train_shards), f"ablation row {row['label']}")
    ev_cfg = load_config("eval", layers=[cfg.eval])
    if ev_cfg.retrieval.image_size is None:  # the row's view size
        size = int(pre_cfg.views.global_size)
        ev_cfg = load_config("eval", None, [f"retrieval.image_size={size}"], layers=[cfg.eval])
    ret = evaluate_page_retrieval(model, pages, None, ev_cfg)
    k = min(ret["summary"]["multi_positive"])
    geom = None
    if "geom" in model.align:  # rows without a geometric head leave the column empty
        geom = head_retrieval(model, geometric_pages(cfg, out_dir, str(pre_cfg.data.descriptor_format)), "geom",
                              int(pre_cfg.views.global_size), seed=seed)
    t3 = time.perf_counter()
    return {"label": row["label"], "table": row.get("table", ""), "experiment": row["experiment"], "seed": seed,
            "det_mAP50": det["mAP50"], "det_mAP50-95": det["mAP50-95"],
            "retrieval_acc1": ret["summary"]["multi_positive"][k]["Acc@1"]["mean"],
            "retrieval_mrr": ret["summary"]["multi_positive"][k]["MRR"]["mean"], "n_gallery": ret["n_gallery"],
            "geom_acc1": "" if geom is None else geom["acc1"], "geom_chance": "" if geom is None else geom["chance"],
            "pretrain_s": round(t1 - t0, 1), "detect_s": round(t2 - t1, 1), "retrieval_s": round(t3 - t2, 1),
            "run_dir": str(run_dir), "detect_dir": str(det_dir)}


def aggregate(results: list[dict], rows: list[dict]) -> list[dict]:
    """Per row (config order): mean and std over seeds of every metric, plus the paper's numbers."""
    out = []
    for row in rows:
        got = [r for r in results if r["experiment"] == row["experiment"]]
        if not got:
            continue
        agg = {"label": row["label"], "table": row.get("table", ""), "seeds": len(got),
               "paper_det": row.get("paper_det"), "paper_retrieval": row.get("paper_retrieval"),
               "n_gallery": got[0]["n_gallery"]}
        for key in ("det_mAP50", "det_mAP50-95", "retrieval_acc1", "geom_acc1"):
            vals = np.array([float(r[key]) for r in got if str(r.get(key, "")) != ""])
            # sample std over seeds (ddof=1); one seed has no spread
            agg[key] = None if not len(vals) else (float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0)
        chance = [float(r["geom_chance"]) for r in got if str(r.get("geom_chance", "")) != ""]
        agg["geom_chance"] = chance[0] if chance else None
        agg["minutes"] = sum(float(r[k]) for r in got for k in ("pretrain_s", "detect_s", "retrieval_s")) / 60
        out.append(agg)
    return out


def _or_dash(v) -> str:
    return "–" if v is None else str(v)


def markdown(agg: list[dict], scale: str) -> str:
    """The table; detection is also shown as the gain over the ``random`` reference row (same head, budget)."""
    ref = next((a for a in agg if a["label"].startswith("random backbone")), None)
    lines = ["| configuration | table | det mAP@50 | det mAP@50 − random | det mAP@50-95 | retrieval Acc@1 (1 crop) | "
             "geometric Acc@1 | seeds | paper det | paper retrieval |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def pm(v):
        return "–" if v is None else f"{100 * v[0]:.1f} ± {100 * v[1]:.1f}"
    for a in agg:
        gain = "–" if ref is None or a is ref else f"{100 * (a['det_mAP50'][0] - ref['det_mAP50'][0]):+.1f}"
        cells = [pm(a["det_mAP50"]), gain, pm(a["det_mAP50-95"]), pm(a["retrieval_acc1"]), pm(a.get("geom_acc1"))]
        lines.append(f"| {a['label']} | {a['table']} | " + " | ".join(cells)
                     + f" | {a['seeds']} | {_or_dash(a['paper_det'])} | {_or_dash(a['paper_retrieval'])} |")
    if agg:
        geom_chance = next((a["geom_chance"] for a in agg if a.get("geom_chance")), None)
        lines += ["", f"Numbers in %, mean ± sample std over pretraining seeds; retrieval gallery {agg[0]['n_gallery']} "
                  f"pages (chance {100 / max(int(agg[0]['n_gallery']), 1):.1f}%); geometric Acc@1: a page's box "
                  "descriptors find its image through the geometric head"
                  + (f" (chance {100 * geom_chance:.1f}%)" if geom_chance else "") + f". Scale: {scale}. "
                  "Paper columns: paper 003 Tables 3 and A1 (DocLayNet, 600K pages)."]
    return "\n".join(lines) + "\n"


def plot(agg: list[dict], path: Path) -> Path:
    """``ablation.png``: detection mAP@50, 1-crop and geometric retrieval Acc@1 per row, mean ± std over seeds."""
    nan = (float("nan"), float("nan"))
    columns = {title: ([100 * (a[key] or nan)[0] for a in agg], [100 * (a[key] or nan)[1] for a in agg])
               for key, title in (("det_mAP50", "detection mAP@50 (%)"), ("retrieval_acc1", "retrieval Acc@1, 1 crop (%)"),
                                 ("geom_acc1", "geometric Acc@1 (%)"))}
    return bar_plot(path, [a["label"] for a in agg], columns)


def check_row_configs(cfg, rows: list[dict]) -> None:
    """Each pretraining row's config values, before any data is made (a bad row fails at once, not
    hours into the rows before it)."""
    from gsdistill.config import load_config
    from gsdistill.pretrain.config_checks import check_pretrain_config
    for row in rows:
        if row["experiment"] != RANDOM:
            check_pretrain_config(load_config("pretrain", row["experiment"], layers=[cfg.pretrain]))


def run_ablation(cfg, wanted: list[str] | None = None, config_files: list[Path] = ()) -> Path:
    """Run every selected (row, seed) not yet in ``out_dir/results.csv``; write table and plot."""
    from gsdistill.output_folder import lock_folder
    from gsdistill.pipelines.ablate_folder import check_same_scale
    out_dir = Path(cfg.out_dir)
    check_same_scale(cfg, out_dir, config_files)
    with lock_folder(out_dir):
        return _run_pending(cfg, out_dir, wanted)


def _run_pending(cfg, out_dir: Path, wanted: list[str] | None) -> Path:
    from gsdistill.config import save_config, to_dict
    save_config(cfg, out_dir)
    rows = select_rows(to_dict(cfg.rows), wanted)
    csv_path = out_dir / "results.csv"
    done = {(r["experiment"], str(r["seed"])) for r in read_results(csv_path)}
    pending = [(row, int(s)) for row in rows for s in cfg.seeds if (row["experiment"], str(s)) not in done]
    scale = "; ".join(settings(cfg.pretrain, "pretrain.") + settings(cfg.detect, "detect."))
    if pending:
        check_row_configs(cfg, [row for row, _ in pending])
        data_yaml, eval_pages = detection_set(cfg, out_dir), retrieval_pages(cfg)
    for i, (row, seed) in enumerate(pending):
        print(f"[ablate] {i + 1}/{len(pending)}: {row['label']} (seed {seed})", file=sys.stderr)
        _append(csv_path, run_row(row, seed, cfg, out_dir, data_yaml, eval_pages))
        agg = aggregate(read_results(csv_path), rows)
        (out_dir / "table.md").write_text(markdown(agg, scale))
        plot(agg, out_dir / "ablation.png")
    agg = aggregate(read_results(csv_path), rows)
    (out_dir / "table.md").write_text(markdown(agg, scale))
    if agg:
        plot(agg, out_dir / "ablation.png")
    return out_dir


def main(argv: list[str]) -> int:
    from gsdistill.config import load_config
    p = argparse.ArgumentParser(prog="gsdistill ablate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="experiment file over configs/ablate/default.yaml")
    p.add_argument("--rows", nargs="+", help="only these rows (label or experiment name)")
    p.add_argument("overrides", nargs="*", help="key=value, e.g. seeds=[0,1] out_dir=runs/ablate2")
    args = p.parse_args(argv)
    cfg = load_config("ablate", args.config, args.overrides)
    from gsdistill.threads import apply_threads
    apply_threads(cfg.threads, ultralytics=True)  # one process runs every stage of every row
    try:
        from gsdistill.config import experiment_files
        out = run_ablation(cfg, args.rows, experiment_files("ablate", args.config))
    except (ValueError, FileNotFoundError) as e:
        print(f"gsdistill ablate: {e}", file=sys.stderr)
        return 2
    print((out / "table.md").read_text())
    return 0
