"""``train.resume`` continues the same run: same steps, same data, every start and resume on record.

The resumed config is the checkpoint's own (``config.yaml`` beside its weights), with the experiment
file and the command's overrides on top (:func:`resume_config`). A change to a key that fixes what
a step is (``FIXED``: the data selection, model, negatives, groups, loss, batch, seed, label noise
and weakening) is refused unless ``train.resume_changes=allow``; so is a change of ``train.epochs`` /
``curriculum.stage2_epochs`` that alters the loss of an epoch already begun. Extending the run, the
learning rate (lowered after a divergence), logging, checkpoints and the device may change. Every
resume prints the changed keys and appends them to ``RUN_DIR/history.jsonl`` (a start and a stop
are recorded there too), with the data read: absolute paths and a digest of the training data, also
kept in every checkpoint's ``state.json``. The data paths are made absolute before the run starts
(:func:`absolute_data_paths`), so the saved config names what was read wherever a resume starts; a
path that points elsewhere, or data that changed on disk, is refused in one line.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gsdistill import run_history
from gsdistill.config import load_config
from gsdistill.errors import InputError, TrainingDiverged, TrainingInterrupted
from gsdistill.pretrain import checkpoint
from gsdistill.retriever.data import RetrievalData

KEY = "train.resume_changes"
FIXED = ("data.format", "data.split", "data.max_train_queries", "data.folds", "data.fold", "data.fold_seed",
         "model.", "negatives.method", "negatives.depth", "negatives.skip_top", "negatives.per_query",
         "negatives.remine_every_epoch", "groups.", "loss.", "train.batch_size", "train.accumulation",
         "train.seed", "weakening.", "noise.", "curriculum.stage2_loss")
PLAN_KEYS = ("train.epochs", "curriculum.stage2_epochs")
NOT_CHANGES = ("train.resume", "train.stop_after", KEY)  # per invocation: never carried, never a change
DATA_KEYS = ("data.path", "data.corpus", "data.eval_path")


def epoch_plan(cfg) -> list[str]:
    """The loss of every epoch: ``train.epochs`` of ``loss.name``, then the curriculum's second stage."""
    plan = [cfg.loss.name] * int(cfg.train.epochs)
    if int(cfg.curriculum.stage2_epochs) > 0:
        plan += [cfg.curriculum.stage2_loss] * int(cfg.curriculum.stage2_epochs)
    return plan


def read_run_config(ckpt: Path) -> DictConfig:
    """The retriever config saved in a checkpoint folder (today's defaults under it)."""
    return checkpoint.read_config(ckpt, stage="retriever")


def resume_config(experiment, overrides: list[str]) -> DictConfig:
    """The config of ``retriever train [--config EXP] train.resume=X ...``: the checkpoint's own, then
    EXP and the overrides (``train.stop_after`` and ``train.resume_changes`` are not carried over);
    without ``train.resume`` the config as loaded."""
    cfg = load_config("retriever", experiment, overrides)
    if not cfg.train.resume:
        return cfg
    ckpt, _ = checkpoint.find_resumable(cfg.train.resume)
    return load_config("retriever", experiment, ["train.stop_after=null", f"{KEY}=refuse", *overrides],
                       base=ckpt / "config.yaml")


def run_folder_of(ckpt: Path) -> Path | None:
    """The run folder a checkpoint belongs to (``RUN/checkpoints/step-N``), or None for a loose one."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None


def absolute(value) -> str | None:
    return str(Path(str(value)).expanduser().resolve()) if value else None


def absolute_data_paths(cfg) -> None:
    """``data.path``, ``data.corpus`` and ``data.eval_path`` made absolute in place (a relative one
    against the working folder, as the loaders read it)."""
    for key in DATA_KEYS:
        if OmegaConf.select(cfg, key):
            OmegaConf.update(cfg, key, absolute(OmegaConf.select(cfg, key)))


def data_digest(data: RetrievalData) -> str:
    """What a step can read: corpus (ids and texts), queries, graded judgements and negatives."""
    h = hashlib.sha256()
    for part in (data.doc_ids, data.doc_texts):
        for text in part:
            h.update(text.encode("utf-8") + b"\0")
    h.update(json.dumps([data.queries, data.qrels, data.negatives], sort_keys=True).encode("utf-8"))
    return h.hexdigest()[:20]


def data_record(cfg, data: RetrievalData) -> dict:
    """The training data of a start or resume, for ``history.jsonl``: absolute paths and a digest."""
    return {"paths": {k: absolute(OmegaConf.select(cfg, k)) for k in DATA_KEYS if OmegaConf.select(cfg, k)},
            "digest": data_digest(data), "docs": len(data.doc_ids), "queries": len(data.queries)}


@dataclass
class Resume:
    """What a resume continues: the checkpoint, its step, the changes (``{key: (old, new)}``)."""
    ckpt: Path
    notes: list[str]
    step: int
    changes: dict
    allowed: bool  # train.resume_changes=allow
    started: dict | None  # data record of the checkpoint (state.json), else of the run's last start or resume
    data: dict | None = field(default=None)  # this resume's data record, once checked

    def describe(self) -> str:
        what = f"resuming from {self.ckpt} (step {self.step})"
        if not self.changes:
            return f"{what}; config unchanged"
        bad = run_history.fixed_changes(self.changes, FIXED + PLAN_KEYS + ("data (digest)",))
        return (f"{what}; config changed since: {run_history.describe(self.changes)}"
                + (f" (allowed by {KEY}=allow)" if bad and self.allowed else ""))


def find_checkpoint(cfg) -> tuple[Path, list[str]] | None:
    return checkpoint.find_resumable(cfg.train.resume) if cfg.train.resume else None


def plan_resume(cfg, found: tuple[Path, list[str]] | None) -> Resume | None:
    """The resume of ``cfg`` from ``found`` (:func:`find_checkpoint`), after the key checks; None for
    a fresh run. Refuses (:class:`InputError`, one line) what would make it another run."""
    if found is None:
        return None
    ckpt, notes = found
    saved, state = read_run_config(ckpt), checkpoint.read_state(ckpt)
    absolute_data_paths(saved)  # a checkpoint of an older run may name them relative: compare like with like
    changes = run_history.config_changes(saved, cfg, ignore=NOT_CHANGES)
    epoch = int((state.get("data_position") or {}).get("epoch", 0))
    fixed = FIXED + (PLAN_KEYS if epoch_plan(saved)[:epoch + 1] != epoch_plan(cfg)[:epoch + 1] else ())
    allowed = str(OmegaConf.select(cfg, KEY) or "").lower() == run_history.ALLOW
    folder = run_folder_of(ckpt)
    started = state.get("data") or (next((row["data"] for row in reversed(run_history.read(folder)) if "data" in row),
                                         None) if folder is not None else None)
    for key, before in ((started or {}).get("paths") or {}).items():  # a moved copy is fine: the digest decides
        now = absolute(OmegaConf.select(cfg, key))
        if now != before and now is not None and not Path(now).exists() and not allowed:
            raise InputError(f"resume from {ckpt}: {key}={OmegaConf.select(cfg, key)} is {now} here, but the run "
                             f"read {before} (a relative path is read from the working folder); pass {key}={before}")
    run_history.check_resume(changes, fixed, OmegaConf.select(cfg, KEY), ckpt, KEY)
    return Resume(ckpt, notes, int(state["step"]), changes, allowed, started)


def check_data(resume: Resume, cfg, data: RetrievalData) -> dict:
    """This resume's data record; refused when the training data differ from the run's own."""
    record = data_record(cfg, data)
    before = (resume.started or {}).get("digest")
    if before is not None and before != record["digest"]:
        if not resume.allowed:
            raise InputError(f"resume from {resume.ckpt}: the training data differ from the data the run read "
                             f"({(resume.started or {}).get('paths')}, digest {before}; now {record['paths']}, "
                             f"digest {record['digest']}); resume with the run's data, start a new run, or set "
                             f"{KEY}=allow to continue on the new data with the change recorded")
        resume.changes["data (digest)"] = (before, record["digest"])
    resume.data = record
    return record


def announce(resume: Resume | None, run_dir: Path, data: dict, world: int) -> None:
    """Rank 0: print a resume's changes (stderr) and append the start or resume to history.jsonl."""
    if resume is None:
        run_history.record(run_dir, "start", 0, data=data, world_size=world)
        return
    for note in resume.notes:
        print(f"[retriever train] resume: {note}", file=sys.stderr)
    print(f"[retriever train] {resume.describe()}", file=sys.stderr)
    run_history.record(run_dir, "resume", resume.step, resume.changes, data=data, world_size=world,
                       checkpoint=str(resume.ckpt), allowed=resume.allowed)


def fit_recorded(loop, run_dir: Path, rank: int) -> None:
    """``loop.fit()``, its stop appended to history.jsonl by rank 0 (finished, stop_after, signal, diverged)."""
    def stop(reason: str) -> None:
        if rank == 0:
            last = loop.last_checkpoint
            run_history.record(run_dir, "stop", loop.step, reason=reason, checkpoint=absolute(last) if last else None)
    try:
        loop.fit()
    except (TrainingInterrupted, TrainingDiverged) as e:
        stop("signal" if isinstance(e, TrainingInterrupted) else "diverged")
        raise
    stop("finished" if loop.step >= loop.plan.steps else "stop_after")
