"""A pretraining run's folder: its root from any of its checkpoint folders, its saved resolved config,
the shard folder it was pretrained on (what the held-out checks of ``gsdistill eval`` and
``gsdistill ablate`` compare against), and whether a new run may start in it.

A run never starts in a folder that holds another run's files: its metrics, backbone and
``latest`` checkpoint would replace the earlier run's and its checkpoints mix with them
(:func:`claim`); nor in a folder holding files gsdistill did not write, unless ``--overwrite``.
``--overwrite`` removes what gsdistill wrote there (the folder's record of it,
:mod:`gsdistill.output_manifest`; in a run folder from before records, the names of :data:`RUN`),
never a file of the user's, never through a link; a name a run writes (``config.yaml``, ``data/``)
that is the user's is refused, ``--overwrite`` or not.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from gsdistill.errors import MissingFileError
from gsdistill.output_folder import OutputConflict, check_claim, remove_earlier
from gsdistill.output_manifest import Layout
from gsdistill.output_removal import describe
from gsdistill.tuples.store.folder import SHARD_FOLDER

# what a pretraining run writes into its folder
RUN_FILES = ("checkpoints", "metrics.csv", "tb", "plots", "backbone", "config.yaml", "history.jsonl", "data",
             "profile")
# files only a run leaves: without one of them a folder holding e.g. data/ or config.yaml may be the user's own
RUN_MARKERS = ("checkpoints", "metrics.csv", "history.jsonl")
RUN = Layout("a pretraining run", RUN_FILES,
             ("checkpoints/step-*/*", "checkpoints/step-*/deepspeed/**", "checkpoints/.tmp-step-*/*",
              "checkpoints/.tmp-step-*/deepspeed/**", "checkpoints/latest", "checkpoints/latest.tmp", "metrics.csv",
              "tb/events.out.tfevents.*", "plots/*.png", "backbone/backbone.safetensors", "backbone/backbone.json",
              "backbone/*.tmp", "config.yaml", "history.jsonl", "profile/top_ops.txt", "profile/trace.json")
             + SHARD_FOLDER.under("data").legacy,
             ("checkpoints/latest", "checkpoints/step-*/model.safetensors", "metrics.csv", "history.jsonl"),
             (("checkpoints/latest",), ("checkpoints/step-*/model.safetensors",), ("metrics.csv", "history.jsonl"),
              ("backbone/backbone.safetensors", "config.yaml")))


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
    """The top-level names of what gsdistill wrote in ``folder`` (an earlier run's files)."""
    from gsdistill.output_removal import inventory
    inv = inventory(Path(folder), RUN)
    return sorted({p.split("/", 1)[0] for p in inv.ours})


def claim(folder: Path, resumes_here: bool, overwrite: bool, resumed: Path | None = None) -> list[str]:
    """Make ``folder`` ready for a run to start in it; return the top-level names of what was removed
    (``overwrite``).

    A new or empty folder is fine; so is the folder of the run being resumed (``resumes_here``). A
    folder holding an earlier run (its checkpoints, metrics or history, written by gsdistill) is
    refused (:class:`OutputConflict`) unless ``overwrite``, and so is one holding files gsdistill did
    not write: the message says which it is. ``overwrite`` removes what gsdistill wrote there
    (never the checkpoint ``resumed`` reads); files gsdistill did not write stay, and one at a name
    a run writes is refused, ``overwrite`` or not."""
    folder = Path(folder)
    if resumes_here:
        return []
    inv = check_claim(folder, "--run-dir", RUN, overwrite, fresh=False)
    held = inv.ours_matching(RUN)
    if held and not overwrite:
        raise OutputConflict(f"--run-dir {folder}: holds an earlier run ({describe(held)}); resume it with "
                             f"train.resume={folder}, choose another --run-dir, or pass --overwrite to replace it "
                             f"(only what gsdistill wrote there is removed)")
    check_claim(folder, "--run-dir", RUN, overwrite)
    if not overwrite or not inv.ours:
        return []
    if resumed is not None and folder.resolve() in Path(resumed).resolve().parents:
        raise OutputConflict(f"--run-dir {folder}: --overwrite would delete the checkpoint train.resume reads "
                             f"({resumed}); resume in place without --overwrite, or choose another --run-dir")
    removal = remove_earlier(folder, RUN)
    return sorted({p.rstrip("/").split("/", 1)[0] for p in removal.removed})
