"""A pretraining run's folder: its root from any of its checkpoint folders, its saved resolved config,
the shard folder it was pretrained on (what the held-out checks of ``gsdistill eval`` and
``gsdistill ablate`` compare against), and whether a new run may start in it.

A run never starts in a folder that holds another run's files: its metrics, backbone and
``latest`` checkpoint would replace the earlier run's and its checkpoints mix with them
(:func:`claim`). ``--overwrite`` removes the files a run writes (:data:`RUN_FILES`), nothing else.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from gsdistill.errors import MissingFileError
from gsdistill.output_folder import OutputConflict

# what a pretraining run writes into its folder: what --overwrite removes, and all it removes
RUN_FILES = ("checkpoints", "metrics.csv", "tb", "plots", "backbone", "config.yaml", "history.jsonl", "data",
             "profile")
# files only a run leaves: without one of them a folder holding e.g. data/ may be the user's own
RUN_MARKERS = ("checkpoints", "metrics.csv", "config.yaml", "history.jsonl")


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


def run_files(folder: Path) -> list[str]:
    """The names of :data:`RUN_FILES` present in ``folder`` (an earlier run's files)."""
    folder = Path(folder)
    return [n for n in RUN_FILES if (folder / n).exists() or (folder / n).is_symlink()]


def claim(folder: Path, resumes_here: bool, overwrite: bool, resumed: Path | None = None) -> list[str]:
    """Make ``folder`` ready for a run to start in it; return the names removed (``overwrite``).

    A new or empty folder (or one with only files a run never writes) is fine; so is the folder of
    the run being resumed (``resumes_here``). Any other folder with a run's files is refused
    (:class:`OutputConflict`) unless ``overwrite``: then exactly those files are removed, and only
    when the folder is recognisably a run's, and never the checkpoint ``resumed`` reads."""
    folder = Path(folder)
    found = run_files(folder)
    if resumes_here or not found:
        return []
    if not overwrite:
        raise OutputConflict(f"--run-dir {folder}: holds an earlier run ({', '.join(found)}); resume it with "
                             f"train.resume={folder}, choose another --run-dir, or pass --overwrite to replace it "
                             f"(only the files a run writes are removed)")
    if not any(n in found for n in RUN_MARKERS):
        raise OutputConflict(f"--run-dir {folder}: holds {', '.join(found)} but no run ({', '.join(RUN_MARKERS)}); "
                             "--overwrite removes only a run's own files: choose another --run-dir")
    if resumed is not None and folder.resolve() in Path(resumed).resolve().parents:
        raise OutputConflict(f"--run-dir {folder}: --overwrite would delete the checkpoint train.resume reads "
                             f"({resumed}); resume in place without --overwrite, or choose another --run-dir")
    for name in found:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:  # a file, or a link: the link goes, never what it points to
            path.unlink()
    return found
