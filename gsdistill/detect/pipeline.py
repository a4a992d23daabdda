"""Export the backbone into an Ultralytics YOLOv10 detector and train its head with Ultralytics' trainer.

``build_detector`` -> ``export_detector`` (a ``.pt`` any process can load with ``YOLO(path)``) ->
``train_head`` (``freeze=[0]``: the ViT never trains, the pyramid + v10Detect head do) ->
``validate`` (Ultralytics mAP + pycocotools on the same predictions, in ``evaluate.py``).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")  # never let Ultralytics look for the network

import torch  # noqa: E402
import yaml  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from ultralytics import YOLO  # noqa: E402

from gsdistill.config import save_config, to_dict  # noqa: E402
from gsdistill.detect.backbone_folder import read_backbone_folder  # noqa: E402
from gsdistill.detect.checks import check_yolo_dataset, read_data_yaml, readable_data_yaml, skipped_images  # noqa: E402
from gsdistill.detect.device_string import resolve_device  # noqa: E402  (also public here)
from gsdistill.detect.evaluate import param_counts, validate  # noqa: E402,F401  (validate: public entry point)
from gsdistill.detect.finite import add_divergence_guard, check_finite_backbone  # noqa: E402
from gsdistill.detect.repeat_factor import repeat_factor_data  # noqa: E402
from gsdistill.detect.run_folder import claim_run_dir, removed_unless_resumable, train_inputs  # noqa: E402
from gsdistill.detect.run_logging import add_run_callbacks  # noqa: E402
from gsdistill.detect.safe_load import load_yolo, register_extra_globals, restricted_loading  # noqa: E402
from gsdistill.detect.modules import BACKBONE_LAYER, detector_yaml  # noqa: E402
from gsdistill.models.backbone import backbone_kwargs, create_backbone, load_backbone  # noqa: E402
from gsdistill.output_folder import OutputConflict, check_output_dir, lock_folder  # noqa: E402
from gsdistill.pretrain.config_checks import check_backbone  # noqa: E402


def _backbone(backbone_dir: str | Path | None, cfg: DictConfig) -> tuple[str, dict, torch.nn.Module]:
    """(timm name, timm kwargs, ViT with its weights): the exported one, or a random one from the config."""
    if backbone_dir:
        meta = read_backbone_folder(backbone_dir)  # clear error when the folder is not an export
        vit = load_backbone(backbone_dir)  # wrong shapes: clear error
        check_finite_backbone(vit, backbone_dir)  # a NaN backbone would train to a best.pt of zeros
        return meta["model_name"], meta["kwargs"], vit
    spec = to_dict(cfg.random_backbone) if isinstance(cfg, DictConfig) else dict(cfg["random_backbone"])
    return spec["name"], backbone_kwargs(spec), create_backbone(spec)


def build_detector(backbone_dir: Path | None, nc: int, cfg: DictConfig, names: list[str] | None = None) -> YOLO:
    """Ultralytics YOLO: ViT (weights of ``backbone_dir``, or random when None) + pyramid + v10Detect(nc)."""
    name, kwargs, vit = _backbone(backbone_dir, cfg)
    spec = detector_yaml(name, kwargs, embed_dim=vit.embed_dim, patch_size=vit.patch_embed.patch_size[0],
                         nc=nc, c_out=int(cfg.adapter_channels), frozen=bool(cfg.frozen),
                         input_norm=bool(cfg.adapter_input_norm), features=str(cfg.adapter_features),
                         depth=len(vit.blocks), neck=str(cfg.adapter_neck))
    # provenance rides in the model YAML, which Ultralytics copies into every checkpoint it writes
    spec["gsdistill"] = {"backbone": str(Path(backbone_dir).resolve()) if backbone_dir else "random",
                         "config": to_dict(cfg) if isinstance(cfg, DictConfig) else dict(cfg)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gsdistill_vit_detector.yaml"  # no "<digits><n|s|m|l|x>" in the name: no scale guessing
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        det = YOLO(str(path), task="detect")
    det.model.model[BACKBONE_LAYER].vit.load_state_dict(vit.state_dict())
    det.model.names = dict(enumerate(names or [f"class{i}" for i in range(nc)]))
    return det


def export_detector(backbone_dir: Path | None, names: list[str], cfg: DictConfig, out_path: str | Path) -> Path:
    """Save the untrained detector as an Ultralytics ``.pt`` (+ ``params.json``); return its path.

    Ultralytics stores checkpoints in fp16, so the ViT weights in every ``.pt`` are the fp16
    rounding of the exported fp32 backbone; training keeps exactly those values.
    """
    out_path = Path(out_path)
    params_path = out_path.with_name("params.json")
    if out_path.is_dir():
        raise OutputConflict(f"--out {out_path}: is a folder; give the path of the .pt file to write")
    check_output_dir(out_path.parent, "--out")  # a file where its folder should be: one line
    folder, backbone = out_path.parent.resolve(), Path(backbone_dir or "").resolve()
    if backbone_dir and (folder == backbone or backbone in folder.parents):
        raise OutputConflict(f"--out {out_path}: lies in the backbone folder {backbone_dir} it is built from; "
                             "write the detector outside it")
    with lock_folder(out_path.parent):  # params.json is per folder: one export writes a folder at a time
        _check_params_json(params_path, out_path)  # before anything is written
        det = build_detector(backbone_dir, len(names), cfg, names)
        det.save(str(out_path))
        total, trainable = param_counts(det.model, frozen=bool(cfg.frozen))
        info = {"weights": str(out_path.resolve()), "backbone": det.model.yaml["gsdistill"]["backbone"],
                "nc": len(names), "names": list(names), "params_total": total, "params_trainable": trainable}
        params_path.write_text(json.dumps(info, indent=1))
    return out_path


def _check_params_json(params_path: Path, out_path: Path) -> None:
    """Refuse to replace a ``params.json`` that describes another file (another export, or a train run's),
    and a ``.pt`` that no ``params.json`` beside it names as an export (a trained ``best.pt``, say)."""
    if not params_path.exists():
        if out_path.exists():
            raise OutputConflict(f"--out {out_path}: already exists and is not an earlier export (no params.json "
                                 "beside it names it), e.g. a trained model; give a new path or move that file")
        return
    try:
        owner = json.loads(params_path.read_text()).get("weights")
    except (OSError, ValueError, AttributeError):
        owner = None
    if owner is None or Path(owner).resolve() != out_path.resolve():
        raise FileExistsError(f"{params_path} already exists and describes {owner or 'something else'}, not "
                              f"{out_path}; export into another folder (each export writes params.json beside "
                              "its .pt) or remove that file")


def train_args(cfg: DictConfig, data_yaml: str, run_dir: Path) -> dict:
    """Ultralytics ``train()`` keyword arguments from the gsdistill config."""
    args = {k: cfg[k] for k in ("epochs", "imgsz", "batch", "workers", "optimizer", "lr0", "lrf", "weight_decay",
                                "momentum", "warmup_epochs", "warmup_momentum", "warmup_bias_lr", "box", "cls", "dfl",
                                "cos_lr", "seed", "amp", "patience", "save_period", "plots", "cache")}
    args["nbs"] = int(cfg.nbs) if cfg.nbs is not None else int(cfg.batch)  # null: one optimizer step per batch
    args.update(to_dict(cfg.augment))
    args.update(data=str(data_yaml), device=resolve_device(cfg.device), project=str(run_dir.parent),
                name=run_dir.name, exist_ok=True, val=bool(cfg.val_during_training), deterministic=True,
                freeze=[BACKBONE_LAYER] if cfg.frozen else None, verbose=False)
    return args


def _resume_checkpoint(resume: str) -> Path:
    path = Path(resume)
    if path.is_dir():
        path = path / "weights" / "last.pt"
    if not path.is_file():
        raise FileNotFoundError(f"resume: no checkpoint at {path} (give last.pt or the run dir holding weights/)")
    return path


def _attach(model: YOLO, run_dir: Path, callbacks: dict | None) -> None:
    add_run_callbacks(model, run_dir)
    add_divergence_guard(model, run_dir)
    for event, fns in (callbacks or {}).items():
        for fn in fns:
            model.add_callback(event, fn)


_DETERMINISM_ENV = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED")


@contextlib.contextmanager
def determinism_kept():
    """Torch's process-wide determinism settings as they were before, once the block ends.

    Ultralytics' trainer switches deterministic algorithms on for the whole process while it trains
    (``train_args`` asks for them); releases before 8.4 left them on, so every later stage of the
    process (the next ``ablate`` row) ran slower, and later ones switch them off and drop
    ``CUBLAS_WORKSPACE_CONFIG`` / ``PYTHONHASHSEED`` even where the user had set them."""
    import torch.utils.deterministic as deterministic

    flags = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    fill, env = deterministic.fill_uninitialized_memory, {k: os.environ.get(k) for k in _DETERMINISM_ENV}
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        deterministic.fill_uninitialized_memory = fill
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def train_head(cfg: DictConfig, callbacks: dict[str, list] | None = None) -> Path:
    """Fine-tune the detection head (backbone frozen unless ``frozen=false``); return the Ultralytics run dir.

    The run dir holds ``weights/{best,last}.pt``, Ultralytics' ``results.csv``, the gsdistill
    ``config.yaml``, ``params.json``, ``tensorboard/`` and ``plots/training.png``. ``callbacks``
    (Ultralytics event -> functions of the trainer) are added to the run, e.g. for monitoring.
    Deterministic algorithms are on while it trains, and as they were before once it returns.
    """
    with determinism_kept():
        return _train_head(cfg, callbacks)


def _train_head(cfg: DictConfig, callbacks: dict[str, list] | None) -> Path:
    if cfg.resume:
        last = _resume_checkpoint(str(cfg.resume))
        run_dir = last.parent.parent
        safe = bool(cfg.safe_load)
        with lock_folder(run_dir):  # a second process resuming the same run: refused with the holder's PID
            print(f"[detect] resuming run dir: {run_dir}", file=sys.stderr, flush=True)
            model = load_yolo(last, safe=safe)
            _attach(model, run_dir, callbacks)
            # the trainer unpickles last.pt (and later best.pt) again itself: keep those loads restricted too
            with restricted_loading() if safe else contextlib.nullcontext():
                if safe:
                    register_extra_globals(last)
                model.train(resume=True, device=resolve_device(cfg.device), workers=cfg.workers)
        return run_dir
    if not cfg.data:
        raise ValueError("detect train: set data=<data YAML> (make one with `gsdistill detect convert`)")
    data = read_data_yaml(cfg.data)
    inputs = train_inputs(cfg, data)
    check_output_dir(Path(cfg.project) / cfg.name, "project/name")  # a file there: one line, before the data check
    _check_model_source(cfg)
    report = check_training_data(cfg)
    with contextlib.ExitStack() as held:
        run_dir = claim_run_dir(Path(cfg.project).resolve() / cfg.name, inputs, held)
        held.enter_context(removed_unless_resumable(run_dir))
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir)
        train_data = record_data_check(report, cfg.data, run_dir)
        if float(cfg.repeat_threshold) > 0:  # rare classes (tables, figures) seen more often, LVIS-style
            train_data = repeat_factor_data(train_data, float(cfg.repeat_threshold), int(cfg.seed),
                                            run_dir / "data_repeat")
        weights = Path(cfg.model) if cfg.model else export_detector(cfg.backbone, data["names"], cfg,
                                                                    run_dir / "init" / "detector.pt")
        model = load_yolo(weights, safe=bool(cfg.safe_load))
        _attach(model, run_dir, callbacks)
        model.train(**train_args(cfg, str(Path(train_data).resolve()), run_dir))
    return run_dir


def check_training_data(cfg: DictConfig) -> dict:
    """The data check's report (``{}`` with ``data_check.enabled=false``)."""
    if not cfg.data_check.enabled:
        return {}
    return check_yolo_dataset(cfg.data, allow_empty_labels=bool(cfg.data_check.allow_empty_labels))


def record_data_check(report: dict, data_yaml: str | Path, run_dir: Path) -> Path:
    """Write ``report`` into the run (``report.json`` lists its skips from there), say in one stderr
    line what it skipped, and return the data YAML Ultralytics is to read (the readable images)."""
    (run_dir / "data_check.json").write_text(json.dumps(report, indent=1))
    skipped = skipped_images(report)
    if skipped:
        counts = ", ".join(f"{len(st['unreadable'])} of {st['images'] + len(st['unreadable'])} {split}"
                           for split, st in report.items() if st["unreadable"])
        first = skipped[0]
        print(f"[detect] skipping {counts} images that do not decode (listed in {run_dir / 'report.json'}), "
              f"e.g. {first['image']}: {first['reason']}", file=sys.stderr, flush=True)
    return readable_data_yaml(data_yaml, report, run_dir / "data")


def _check_model_source(cfg: DictConfig) -> None:
    """What the detector starts from, checked before a run folder exists: the .pt, else the exported
    backbone folder, else the random backbone's timm name and sizes."""
    if cfg.model:
        if not Path(cfg.model).is_file():
            raise FileNotFoundError(f"model: {cfg.model} does not exist (make one with `gsdistill detect export`)")
    elif cfg.backbone:
        read_backbone_folder(cfg.backbone)
    else:
        check_backbone(to_dict(cfg.random_backbone), key="random_backbone")
