"""Part B of the lease: the science, within its budget (``tools/gpu/lease.py``; docs/gpu.md, "The science recipe").

Real pages carried from here (``lease_prepare.py``: pretraining and held-out documents apart) are unpacked and
their texts embedded; the recipe (``configs/demo/gpu_pdfs.yaml``) pretrains for a fixed number of minutes while
the heads-only control (the same run on the frozen random backbone) trains beside it on the same GPU (each
loop is bound by its host thread, so two share the device at little cost); then, on the held-out pages, the
demo's own stages: head-only detection on the pretrained backbone, on its random twin and a stock YOLOv10n at
one budget (``gsdistill.pipelines.demo.detect``: paired bootstrap over held-out documents), and retrieval from
1, 5 and 8 text crops and from the box descriptors (``demo_learning.measure`` / ``paired_gain``) against the
control. Every stage rewrites the report.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpu_check import QUIET, TINY

ROOT = Path(__file__).resolve().parents[2]
PART = "B. the science"
RECIPE = "gpu_pdfs"
DETECT_RESERVE_S = 150  # of part B's budget kept for detection (3 detectors) and retrieval after pretraining
PLANNED_STEP_S = 0.30  # the recipe's eager step on an H200, planned: gpu_vit_s16 eager at batch 64 ran 0.238 s, host-bound
CHANCE_X = 3.0  # semantic retrieval from 5 crops: >= 3x chance held out


def recipe(cpu: bool):
    """The demo config of part B; toy sizes in the CPU rehearsal (the recipe's own keys, then smaller ones)."""
    from gsdistill.config import load_config

    cfg = load_config("demo", RECIPE)
    if not cpu:
        return cfg
    toy = {"pretrain": [*map(str, cfg.pretrain), *TINY[:-1], "optim.batch_size=2", "data.num_workers=1", "train.device=cpu",
                        "train.precision=fp32", "optim.warmup_steps=1", "objective.distill_warmup_steps=1"],
           "detect": ["device=cpu", "imgsz=64", "epochs=1", "batch=4", "nbs=4", "workers=0", "adapter_channels=16"],
           "predict_pages": 1}
    return load_config("demo", RECIPE, layers=[toy])


def pretrain_cmd(cfg, train_dir: Path, run_dir: Path, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gsdistill.cli", "pretrain", str(cfg.pretrain_experiment), "--run-dir", str(run_dir),
            "--overwrite", *cfg.pretrain, f"data.shards={train_dir}", f"train.seed={cfg.seed}", f"optim.steps={steps}",
            *QUIET, *extra]


def run_side_by_side(cmds: dict[str, list[str]], logs: Path, timeout: float) -> dict[str, object]:
    """Start every command at once; wait for all (killing what outlives ``timeout``); exit code by name."""
    procs = {}
    for name, cmd in cmds.items():
        procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=open(logs / f"{name}.log", "w"), stderr=subprocess.STDOUT)
    end, codes = time.time() + timeout, {}
    for name, p in procs.items():
        try:
            codes[name] = p.wait(timeout=max(1.0, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            codes[name] = "timeout"
    return codes


def pretrain_row(name: str, run_dir: Path, rc, batch: int) -> tuple[str, dict]:
    from gsdistill.pretrain.metrics_log import read_metrics

    rows = read_metrics(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else []
    if rc != 0 or len(rows) < 2:
        return f"| {name} | {rc} | {len(rows)} | | | | | |", {}
    step = statistics.median(float(r["step_s"]) for r in rows[1:])
    first, last = rows[0], rows[-1]
    got = {"steps": len(rows), "step_s": step, "views_per_min": 60 * batch / step,
           "peak_mem_gb": max(float(r.get("peak_mem_gb") or 0) for r in rows),
           "total_first": float(first["total"]), "total_last": float(last["total"])}
    return (f"| {name} | 0 | {got['steps']} | {step:.3f} | {got['views_per_min']:,.0f} | {got['peak_mem_gb']:.1f} | "
            f"{got['total_first']:.3f} -> {got['total_last']:.3f} |"), got


def interval(d: dict) -> str:
    """A paired difference in points: ``+d.dd [+lo, +hi]``."""
    return f"{100 * d['diff']:+.2f} [{100 * d['ci95'][0]:+.2f}, {100 * d['ci95'][1]:+.2f}]"


def detection_lines(det: dict) -> tuple[list[str], dict]:
    from gsdistill.detect.compare import markdown_table

    lines = ["", f"Head-only detection on the held-out pages ({det['head']}; `{' '.join(det['overrides'])}`):", "",
             markdown_table(det["summary"]), ""]
    got = {}
    for key, paired in det["paired"].items():
        m50, m95 = paired["map50"], paired["map50_95"]
        got[key] = {"a": paired["a"], "b": paired["b"], "n_docs": paired["n_docs"], "map50": m50, "map50_95": m95}
        lines.append(f"- {paired['b']} minus {paired['a']}: mAP@50 {interval(m50)}, mAP@[50:95] {interval(m95)} "
                     f"(paired bootstrap over {paired['n_docs']} held-out documents)")
    return lines, got


def retrieval_lines(cfg, run_dir: Path, control_dir: Path, eval_dir: Path, device: str) -> tuple[list[str], dict]:
    from gsdistill.config import load_config
    from gsdistill.pipelines.demo import CONTROL, PRETRAINED, UNTRAINED
    from gsdistill.pipelines.demo_learning import HEAD_QUERIES, measure, paired_gain, retrieval_markdown, untrained_model
    from gsdistill.pretrain.checkpoint import load_pretrained
    from gsdistill.tuples.store.reader import read_pages
    from gsdistill.tuples.store.text_cache import open_embeddings

    models = {PRETRAINED: load_pretrained(run_dir), CONTROL: load_pretrained(control_dir),
              UNTRAINED: untrained_model(run_dir, int(cfg.seed) + 1)}
    pages = list(read_pages(eval_dir, embeddings=open_embeddings(eval_dir, required=True)))
    size = int(load_config("pretrain", run_dir / "config.yaml").views.global_size)
    rows = measure(models, {"held-out": pages}, size, seed=int(cfg.seed), device=device)
    docs = [str(p.get("doc_id") or p["id"]) for p in pages]
    lines = ["", f"Retrieval on the held-out pages ({len(pages)} pages of {len(set(docs))} documents, "
                 f"{size} px page view; Acc@1 % [95 % interval over documents]):", "",
             retrieval_markdown(rows, "held-out"), "", "Pretrained minus the heads-only control, paired:", ""]
    gains = {}
    for head, k in HEAD_QUERIES:
        g = paired_gain(rows, CONTROL, PRETRAINED, "held-out", head, "all" if k is None else k, doc_of=docs,
                        seed=int(cfg.seed))
        if g is not None:
            what = "geometric (all box descriptors)" if head == "geom" else f"semantic, {k} crop(s)"
            gains[f"{head}@{k}"] = g
            lines.append(f"- {what}: {interval(g)} points of Acc@1")
    sem5 = next((r for r in rows if r["model"] == PRETRAINED and r["head"] == "sem" and r["k"] == 5), None)
    return lines, {"gains": gains, "sem5": sem5 and {k: sem5[k] for k in ("acc1", "ci95", "chance", "n_pages")}}


def science_part(report, out: Path, cpu: bool, budget: float, bundle: Path, minutes: float, step_s: float,
                 steps: int | None = None) -> None:
    """Part B within ``budget`` seconds: ``steps`` of pretraining (default ``minutes`` at ``step_s`` a step)."""
    from gsdistill.models.text_encoder import TextEncoder
    from gsdistill.pipelines.demo import PRETRAINED, detect, pretrain_config
    from gsdistill.tuples.embedding.stage import embed_shards
    from gsdistill.tuples.store.text_cache import fields_for
    from lease_pages import unpack_bundle

    start, cfg = time.time(), recipe(cpu)
    left = lambda: max(5.0, start + budget - time.time())  # noqa: E731
    data = out / "data"
    pages, codec = unpack_bundle(bundle, data)
    train_dir, eval_dir = data / "train", data / "eval"
    pcfg = pretrain_config(cfg, train_dir)
    for d in (train_dir, eval_dir):
        embed_shards(d, TextEncoder, str(pcfg.model.text_encoder), descriptor_format=pcfg.data.descriptor_format,
                     fields=fields_for(pcfg.objective.positives), progress=False, device="cpu" if cpu else "cuda")
    meta = json.loads((bundle.parent / "pages.json").read_text()) if (bundle.parent / "pages.json").is_file() else {}
    size = str(int(pretrain_config(recipe(False), train_dir).views.global_size))  # the recipe's, in a rehearsal too
    heights = meta.get("text_height_px", {}).get(size, {})
    plan = (f"{steps} steps (given)" if steps else
            f"{max(2, int(minutes * 60 / step_s))} steps = {minutes:g} minutes at a planned {step_s:.3f} s a step")
    steps = steps or max(2, int(minutes * 60 / step_s))
    shown = ", ".join(f"{k} {v:.1f}" for k, v in heights.items()) or "not measured"
    report.part(PART, [f"Pages: {pages['train']} pretraining, {pages['eval']} held-out (other documents), written as "
                       f"`{codec}`, embedded at {time.time() - start:.0f} s. Text in the recipe's {size} px global view "
                       f"(median one-line heights, view px, measured where the pages were built): {shown}.", "",
                       f"Pretraining (`configs/demo/{RECIPE}.yaml`): {plan}; the heads-only control beside it on the "
                       "same device:", "",
                       "| run | exit | steps | median step s | page-views/min | peak GiB | total loss first -> last |",
                       "|---|---|---:|---:|---:|---:|---|"], {"pages": pages, "codec": codec, "steps": steps})
    runs = {"pretrain": out / "pretrain", "control": out / "control"}
    cmds = {"pretrain": pretrain_cmd(cfg, train_dir, runs["pretrain"], steps),
            "control": pretrain_cmd(cfg, train_dir, runs["control"], steps, "model.freeze_backbone=true")}
    codes = run_side_by_side(cmds, out, timeout=left() - (0 if cpu else DETECT_RESERVE_S))
    batch = int(pcfg.optim.batch_size)
    for name, run_dir in runs.items():
        line, got = pretrain_row(name, run_dir, codes[name], batch)
        report.part(PART, [line], {name: got})
    if any(codes[n] != 0 for n in runs):
        report.part(PART, ["", "Pretraining failed (logs `pretrain.log`, `control.log`): no detection, no retrieval."])
        return
    det = detect(cfg, train_dir, eval_dir, runs["pretrain"] / "backbone", out)
    lines, paired = detection_lines(det)
    report.part(PART, lines, {"detect": {"summary": det["summary"], "paired": paired}})
    if "backbone" in paired:
        d = paired["backbone"]["map50"]
        report.target("pretrained - random twin >= +5 mAP@50 (held-out)", interval(d), d["diff"] >= 0.05)
    if "reference" in paired:
        d = paired["reference"]["map50"]
        report.target("head-only >= the stock YOLOv10n (held-out)", interval(d), d["diff"] >= 0)
    lines, got = retrieval_lines(cfg, runs["pretrain"], runs["control"], eval_dir, "cpu" if cpu else "cuda")
    report.part(PART, lines, {"retrieval": got})
    if got["sem5"]:
        s = got["sem5"]
        report.target(f"semantic retrieval from 5 crops >= {CHANCE_X:g}x chance (held-out, {PRETRAINED})",
                      f"{100 * s['acc1']:.1f} % = {s['acc1'] / s['chance']:.1f}x chance ({100 * s['chance']:.2f} %)",
                      s["acc1"] >= CHANCE_X * s["chance"])
