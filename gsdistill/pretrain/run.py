"""``run_pretraining(cfg)``: data -> GSDistill model -> engine -> loop -> checkpoints -> backbone export.

Data come from ``cfg.data.shards`` (a shard dir with cached text embeddings); when it is empty,
synthetic pages are generated, written as shards and embedded into ``RUN_DIR/data`` first (the
embedded default: no download, runs anywhere).

Resuming (``train.resume``) continues the run in its own folder; the run's ``config.yaml`` is
written only once the checkpoint has loaded, so a failed resume leaves it as it was. The CLI
builds the resumed config from the checkpoint's own (:func:`resume_config`); a resume that changes
what a step is, or whose data changed, is refused (:mod:`gsdistill.pretrain.same_run`).

The run folder is held (``lock_folder``, rank 0) for the whole run: a second process writing it is
refused with the holder's PID. A new run never starts in a folder holding another run's files
unless ``overwrite`` (:func:`gsdistill.pretrain.run_folder.claim`). Every start, resume and stop is
a line of ``RUN_DIR/history.jsonl``.
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from gsdistill import errors, run_history
from gsdistill.config import load_config, save_config
from gsdistill.errors import GsdistillError, InputError, MissingFileError
from gsdistill.models.backbone import create_backbone, non_finite_weights, save_backbone
from gsdistill.output_folder import check_output_dir, lock_folder
from gsdistill.pretrain import bounds, checkpoint, config_checks, run_folder, same_run, startup_checks
from gsdistill.pretrain.distributed import rank0_then_all, setup
from gsdistill.pretrain.loop import Trainer


def config_changes(before, after) -> list[str]:
    """``key: old -> new`` for every value that differs between two resolved configs (the
    per-invocation keys, ``train.resume`` and ``train.stop_after``, left out)."""
    return same_run.describe(same_run.changes_since(before, after))


def resume_config(experiment, overrides: list[str]):
    """The config of ``gsdistill pretrain [EXP] train.resume=X ...``: the resumed checkpoint's own
    resolved config, then EXP and the overrides on top (``train.stop_after`` is not carried over).
    Returns ``(cfg, checkpoint folder, changes)``; the config of a run without resume is returned as
    loaded, with ``None`` and no changes."""
    cfg = load_config("pretrain", experiment, overrides)
    if not cfg["train"]["resume"]:
        return cfg, None, []
    ckpt, _ = checkpoint.find_resumable(cfg["train"]["resume"])
    saved = checkpoint.read_config(ckpt)
    cfg = load_config("pretrain", experiment, ["train.stop_after=null", "train.resume_changes=refuse", *overrides],
                      base=ckpt / "config.yaml")
    return cfg, ckpt, config_changes(saved, cfg)


def _broadcast(value):
    """Rank 0's ``value`` on every rank (itself when alone)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _broadcast_str(value: str) -> str:
    return _broadcast(value)


def resolve_run_dir(cfg, run_dir: Path | None, resumed: Path | None = None) -> Path:
    """``run_dir`` if given; the resumed run's folder on resume; else a new timestamped folder."""
    if run_dir is not None:
        return Path(run_dir)
    if cfg["train"]["resume"]:
        ckpt = resumed or checkpoint.find_resumable(cfg["train"]["resume"])[0]
        return ckpt.parent.parent
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(_broadcast_str(str(Path(cfg["train"]["run_dir"]) / stamp)))


def prepare_synthetic(cfg, out_dir: Path) -> Path:
    """Generate, shard and embed ``data.synthetic_pages`` synthetic pages (once per run dir): built
    on every core this process may use, in at least one shard per reader of the run (ranks x
    ``data.num_workers``; :mod:`gsdistill.tuples.builder.synthetic_sets`)."""
    from gsdistill.tuples.builder.synthetic_sets import build_synthetic

    d = cfg["data"]
    if not (out_dir / "manifest.json").is_file():
        readers = int(os.environ.get("WORLD_SIZE", "1")) * max(1, int(d["num_workers"]))
        build_synthetic(int(d["synthetic_pages"]), out_dir, seed=int(d["synthetic_seed"]), width=int(d["page_width"]),
                        height=int(d["page_height"]), text_scale=float(d["text_scale"]), readers=readers,
                        progress=bool(cfg["train"]["progress"]))
    return embed_cached(cfg, out_dir)


def embed_cached(cfg, shard_dir: Path) -> Path:
    """Shard dir with the frozen text encoder's embeddings of every span and box descriptor."""
    from gsdistill.models.text_encoder import TextEncoder
    from gsdistill.tuples.embedding.stage import embed_shards
    from gsdistill.tuples.store.text_cache import fields_for

    if not (Path(shard_dir) / "manifest.json").is_file():
        raise MissingFileError(f"data.shards={shard_dir}: no manifest.json; build shards with 'gsdistill tuples'")
    # only the fields the objective reads: the whole-page texts are added when a single-positive run asks
    embed_shards(shard_dir, TextEncoder, str(cfg["model"]["text_encoder"]),
                 batch_size=int(cfg["data"]["embed_batch_size"]), descriptor_format=str(cfg["data"]["descriptor_format"]),
                 fields=fields_for(str(cfg["objective"]["positives"])))
    return Path(shard_dir)


EXPORT_WEIGHTS = {"student": "backbone.", "teacher": "teacher.backbone."}


def backbone_state(model_state: dict[str, torch.Tensor], weights: str = "student",
                   source: str = "") -> dict[str, torch.Tensor]:
    """The student's (or the EMA teacher's) backbone weights of a GSDistill state dict; refused when
    there is none, or when any weight is NaN/inf (a broken backbone is never exported)."""
    if weights not in EXPORT_WEIGHTS:
        raise InputError(f"weights={weights!r}: choose one of {', '.join(EXPORT_WEIGHTS)}")
    prefix = EXPORT_WEIGHTS[weights]
    state = {k[len(prefix):]: v for k, v in model_state.items() if k.startswith(prefix)}
    if not state:
        raise InputError(f"{source or 'model state'}: no {weights} backbone in it"
                         + (" (the run trained without self-distillation, so without an EMA teacher)"
                            if weights == "teacher" else ""))
    bad = non_finite_weights(state)
    if bad:
        raise InputError(f"{source or 'model state'}: the {weights} backbone holds NaN/inf weights "
                         f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); not exported: export an "
                         "earlier checkpoint of the run (RUN/checkpoints/step-N)")
    return state


def export_backbone(model_state: dict[str, torch.Tensor], cfg, out_dir: Path, source: str = "",
                    weights: str = "student") -> Path:
    """Write the student's (or the EMA teacher's, ``weights="teacher"``, which DINOv2 evaluates) backbone
    of a GSDistill state dict in the ``save_backbone`` format."""
    state = backbone_state(model_state, weights, source)
    bcfg = dict(cfg["model"]["backbone"])
    backbone = create_backbone(bcfg)
    checkpoint.load_model_state(backbone, state, Path(source or "model state"))
    return save_backbone(backbone, bcfg, out_dir,
                         extra={"source": source, "trained_with": "gsdistill", "weights": weights})


def _checked_data(resumed: Path, shards, rank: int) -> dict:
    """The data record of ``shards``, refused when not the data checkpoint ``resumed`` trained on."""
    data, note = same_run.check_data(checkpoint.read_state(resumed), shards, resumed)
    if note and rank == 0:
        print(f"[pretrain] resume: {note}", file=sys.stderr)
    return data


def _data_stream(cfg, rank: int, world: int, local_batch: int, patch_size: int, run_dir: Path,
                 device: torch.device):
    """``(stream, shard folder)``."""
    from gsdistill.pretrain.data_stream import ShardBatches

    def prepare() -> str:  # rank 0: the text cache is reused when it matches the encoder, (re)built otherwise
        given = cfg["data"]["shards"]
        return str(prepare_synthetic(cfg, run_dir / "data") if not given else embed_cached(cfg, Path(given)))

    shards = rank0_then_all(prepare, timedelta(minutes=int(cfg["data"]["prepare_timeout_minutes"])))
    pages = startup_checks.page_count(cfg, shards)  # the pages as written (a builder may have skipped some)
    if pages is not None:
        startup_checks.check_pages(cfg, world, *pages)
    stream = ShardBatches(str(shards), cfg, rank, world, local_batch, patch_size, pin_memory=device.type == "cuda")
    return stream, Path(shards)


def build_engine(cfg, model, device, world: int, local_batch: int):
    engine_name = cfg["train"]["engine"]
    if engine_name == "torch":
        from gsdistill.pretrain.engine_torch import TorchEngine
        return TorchEngine(model, cfg, device, world)
    if engine_name == "deepspeed":
        from gsdistill.config import configs_dir
        from gsdistill.pretrain.engine_deepspeed import DeepSpeedEngine
        path = Path(cfg["train"]["deepspeed_config"])
        if not path.is_absolute() and not path.is_file():
            path = configs_dir().parent / path
        return DeepSpeedEngine(model.to(device), cfg, device, world, local_batch, path)
    raise InputError(f"train.engine must be 'torch' or 'deepspeed', got {engine_name!r}")


def _claim_run_dir(hold: ExitStack, run_dir: Path, cfg, resumed: Path | None, overwrite: bool,
                   rank: int, config_files: list[Path] = ()) -> list[str]:
    """Rank 0 checks the folder against what the run reads (the data, the experiment files, a checkpoint
    of another run it starts from), holds it for the run (``hold``) and, with ``overwrite``, removes
    what gsdistill wrote there; every rank gets the outcome, so all stop alike on a refusal (the other
    ranks write into the folder too, but only after rank 0 has prepared the data). Returns what was removed."""
    outcome: list[str] | GsdistillError = []
    if rank == 0:
        try:
            shards = cfg["data"]["shards"]
            here = resumed is not None and os.path.realpath(run_folder.run_root(resumed)) == os.path.realpath(run_dir)
            inputs = [("data.shards", shards)] if shards else []
            inputs += [("experiment", f) for f in config_files]
            if resumed is not None and not here:
                inputs.append(("train.resume", run_folder.run_root(resumed)))
            check_output_dir(run_dir, "--run-dir", inputs)
            hold.enter_context(lock_folder(run_dir))
            outcome = run_folder.claim(run_dir, here, overwrite, resumed)
        except GsdistillError as e:
            outcome = e
    outcome = _broadcast(outcome)
    if isinstance(outcome, GsdistillError):
        raise outcome
    return outcome


def _check_resume(model, resumed: Path, changes: dict, cfg) -> None:
    """Before any data is prepared: the checkpoint's weights fit the model (from the file's header),
    and no key that changes what a step is changed without ``train.resume_changes=allow``."""
    try:
        checkpoint.check_model_fits(model, resumed)
    except InputError as e:
        if changes:
            raise InputError(f"{e}; config keys changed since that checkpoint: "
                             f"{', '.join(same_run.describe(changes))}") from None
        raise
    same_run.check_changes(changes, cfg, resumed)


def _absolute(path: Path | None) -> str | None:
    return os.path.abspath(path) if path is not None else None


def _fit(trainer: Trainer, run_dir: Path, rank: int) -> None:
    """``trainer.fit()``, its stop recorded in the run's history (rank 0)."""
    try:
        trainer.fit()
    except (errors.TrainingInterrupted, errors.TrainingDiverged) as e:
        if rank == 0:
            reason = "signal" if isinstance(e, errors.TrainingInterrupted) else "diverged"
            run_history.record(run_dir, "stop", trainer.step, reason=reason,
                               checkpoint=_absolute(trainer.last_checkpoint))
        raise
    if rank == 0:
        run_history.record(run_dir, "stop", trainer.step, reason="finished" if trainer.step >= trainer.plan.steps
                           else "stop_after", checkpoint=_absolute(trainer.last_checkpoint))


def run_pretraining(cfg, run_dir: Path | None = None, batches=None, overwrite: bool = False,
                    config_files: list[Path] = ()) -> Path:
    """Pretrain and return the run dir (config.yaml, metrics.csv, checkpoints/, backbone/, plots/,
    history.jsonl).

    ``batches``: optional callable ``(rank, world) -> stream`` replacing the shard stream (tests, benches).
    ``overwrite``: a folder holding an earlier run is cleared of what gsdistill wrote there instead of
    refused. ``config_files``: the experiment files ``cfg`` was read from (inputs: never in the run folder).
    """
    from gsdistill.models.gsdistill_model import GSDistill

    # config checks before the process group: every rank fails alike, at once, none waits for another
    config_checks.check_pretrain_config(cfg, data=batches is None)
    same_run.absolute_shards(cfg)  # the saved config names the folder read, wherever a resume starts
    if batches is None:
        startup_checks.check_before_start(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    rank, world, device = setup(str(cfg["train"]["engine"]), str(cfg["train"]["device"]),
                                timedelta(minutes=int(cfg["train"]["dist_timeout_minutes"])))
    global_batch = int(cfg["optim"]["batch_size"])
    startup_checks.check_batch_split(cfg, world)
    startup_checks.check_precision(cfg, device)
    if rank == 0:  # stdout, beside "run dir: ...": stderr stays for the one-line errors
        print(f"[pretrain] {startup_checks.describe(cfg, device, world)}", flush=True)
    resumed, changes = None, {}
    if cfg["train"]["resume"]:
        resumed, notes = checkpoint.find_resumable(cfg["train"]["resume"])
        changes = same_run.changes_since(checkpoint.read_config(resumed), cfg)
        if rank == 0:
            for note in notes:
                print(f"[pretrain] resume: {note}", file=sys.stderr)
            print(f"[pretrain] resuming from {resumed}" + (" (the newest intact checkpoint)" if notes else "")
                  + (f"; config changed since: {', '.join(same_run.describe(changes))}" if changes
                     else "; config unchanged"), file=sys.stderr)
    run_dir = resolve_run_dir(cfg, run_dir, resumed)
    with ExitStack() as hold:
        removed = _claim_run_dir(hold, run_dir, cfg, resumed, overwrite, rank, config_files)
        torch.manual_seed(int(cfg["train"]["seed"]))  # identical initial weights on every rank
        model = GSDistill(cfg)
        if resumed is not None:
            _check_resume(model, resumed, changes, cfg)
        patch = int(model.backbone.patch_embed.patch_size[0])
        data, cut = None, None
        if batches is not None:
            stream = batches(rank, world)
        else:
            given = cfg["data"]["shards"]  # checked before its text cache is (re)built: a refusal costs nothing
            if resumed is not None and given:
                data = _checked_data(resumed, given, rank)
            stream, shards = _data_stream(cfg, rank, world, global_batch // world, patch, run_dir, device)
            if data is None:
                data = _checked_data(resumed, shards, rank) if resumed is not None else same_run.data_record(shards)
            cut = bounds.cut_at_max_spans(shards, int(cfg["views"]["max_spans"]))
            if rank == 0:
                print(f"[pretrain] data: {shards}; {bounds.describe_cut(cut)}", flush=True)
        engine = build_engine(cfg, model, device, world, global_batch // world)
        trainer = Trainer(cfg, run_dir, engine, stream, rank, world, device)
        trainer.run_info = {"data": data} if data else {}
        if resumed is not None:
            try:
                trainer.resume(resumed)
            except InputError as e:
                if changes:
                    raise InputError(f"{e}; config keys changed since that checkpoint: "
                                     f"{', '.join(same_run.describe(changes))}") from None
                raise
        if rank == 0:  # only now: a resume that fails leaves the run's config.yaml (and history) as it was
            save_config(cfg, run_dir)
            run_history.record(run_dir, "resume" if resumed else "start", trainer.step, changes,
                               **({"checkpoint": _absolute(resumed)} if resumed else {}),
                               data={k: v for k, v in data.items() if k != "shards"} if data else data, world_size=world,
                               **({"replaced": removed} if removed else {}), **({"bounds": cut} if cut else {}))
        _fit(trainer, run_dir, rank)
        state = engine.model_state()
        if rank == 0:
            export_backbone(state, cfg, run_dir / "backbone", source=str(trainer.last_checkpoint or run_dir))
    return run_dir
