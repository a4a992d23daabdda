"""A pretraining run's folder: its root from any of its checkpoint folders, its saved resolved config,
and the shard folder it was pretrained on (what the held-out checks of ``gsdistill eval`` and
``gsdistill ablate`` compare against)."""
from __future__ import annotations

from pathlib import Path

import yaml

from gsdistill.errors import MissingFileError


def run_root(model_dir: Path) -> Path:
    """The pretraining run folder of ``--model``: a run dir, its ``checkpoints/`` dir or one
    ``checkpoints/step-N`` folder all lead to the run (where its synthetic ``data/`` lives)."""
    model_dir = Path(model_dir)
    if model_dir.name == "checkpoints":
        return model_dir.parent
    if model_dir.parent.name == "checkpoints":
        return model_dir.parent.parent
    return model_dir


def _config_file(model_dir: Path) -> Path | None:
    for cand in (Path(model_dir) / "config.yaml", run_root(model_dir) / "config.yaml"):
        if cand.is_file():
            return cand
    return None


def run_config(run_dir: Path) -> dict:
    """The resolved pretraining config saved in a run (or checkpoint) dir; {} when there is none."""
    path = _config_file(Path(run_dir))
    return (yaml.safe_load(path.read_text()) or {}) if path is not None else {}


def pretrain_source(model_dir: Path, cfg: dict) -> tuple[Path | None, str]:
    """``(shard folder the run was pretrained on, where that path came from)``: ``data.shards`` of
    its saved config (a relative one resolved against the run folder, else the working directory),
    else the synthetic pages in ``RUN/data``. A configured folder that cannot be found is an error:
    the held-out check must not be skipped silently."""
    root = run_root(Path(model_dir))
    origin = _config_file(Path(model_dir)) or root / "config.yaml"
    shards = (cfg.get("data") or {}).get("shards")
    if shards:
        given = Path(str(shards))
        for cand, how in ((given, "absolute") if given.is_absolute() else (root / given, "relative to the run"),
                          (given, "relative to the working directory")):
            if cand.is_dir():
                return cand, f"data.shards={shards!r} of {origin}, {how}"
        raise MissingFileError(f"data.shards={shards!r} of {origin}: not found (tried {root / given} and "
                               f"{given.resolve()}); the held-out check needs the pretraining pages "
                               "(--allow-overlap skips it)")
    synthetic = root / "data"
    if synthetic.is_dir():
        return synthetic, f"the synthetic pretraining pages of run {root}"
    return None, f"no pretraining data recorded for {root}"


def pretrain_shards(run_dir: Path, cfg: dict) -> Path | None:
    """Shard folder a run was pretrained on (``data.shards``, else the synthetic ``RUN_DIR/data``)."""
    return pretrain_source(run_dir, cfg)[0]
