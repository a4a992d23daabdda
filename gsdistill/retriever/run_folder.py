"""The folders ``retriever train`` and ``retriever eval`` write: checked, locked, never reused silently.

A run folder (``run.dir/run.name``) or an evaluation folder (``eval --out``) that already holds a
result is refused: a new run into it would overwrite the saved model and mix its ``metrics.csv``
with the old one. So is a folder holding files gsdistill did not write (a lone ``config.yaml`` of
the user's included), unless ``--overwrite``; a name the command writes that is the user's is refused
always. ``train.resume`` continues the run in its own folder; ``--overwrite`` removes what gsdistill
wrote there (the folder's record, :mod:`gsdistill.output_manifest`; in a folder from before records,
the names listed here), never a file of the user's, never through a link.
The folder is locked (:func:`gsdistill.output_folder.lock_folder`) while it is written: a second
writer is refused with the holder's PID. Under torchrun rank 0 alone locks and cleans; every rank
raises rank 0's refusal (:func:`on_rank0`), so no rank is left waiting in a collective.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch.distributed as dist
from omegaconf import DictConfig

from gsdistill.errors import GsdistillError
from gsdistill.output_folder import OutputConflict, check_claim, check_output_dir, lock_folder, remove_earlier
from gsdistill.output_manifest import Layout
from gsdistill.output_removal import describe
from gsdistill.pretrain.distributed import rank_and_world

# everything a training run writes into its folder (the pipeline, the loop, the run's evaluation)
RUN_OUTPUTS = ("model", "checkpoints", "metrics.csv", "tb", "plots", "config.yaml", "history.jsonl",
               "summary.json", "eval", "data_summary.json")
EVAL_OUTPUTS = ("run.trec", "metrics.json", "per_query.json", "config.yaml", "data_summary.json")
# written before any result (from the inputs alone): a start that failed early is repeated freely
RUN_PREAMBLE = ("data_summary.json",)
EVAL_PREAMBLE = ("config.yaml", "data_summary.json")
RUN = Layout("retriever train", RUN_OUTPUTS,
             ("model/**", "checkpoints/**", "metrics.csv", "tb/**", "plots/*.png", "config.yaml", "history.jsonl",
              "summary.json", "eval/run.trec", "eval/metrics.json", "eval/per_query.json", "data_summary.json"),
             tuple(n for n in RUN_OUTPUTS if n not in RUN_PREAMBLE + ("config.yaml",)),
             (("summary.json", "config.yaml"), ("history.jsonl", "config.yaml"), ("model/*", "config.yaml")))
EVAL = Layout("retriever eval", EVAL_OUTPUTS, EVAL_OUTPUTS,
              tuple(n for n in EVAL_OUTPUTS if n not in EVAL_PREAMBLE),
              (("run.trec", "metrics.json"), ("per_query.json", "metrics.json")))


def input_paths(cfg: DictConfig, model: str | None = None, config: str | None = None) -> list[tuple[str, str]]:
    """The files and folders a retriever command reads, for :func:`check_output_dir` (the experiment
    file ``config`` and its bases included)."""
    from gsdistill.config import experiment_files
    named = [("data.path", cfg.data.path), ("data.corpus", cfg.data.corpus), ("data.eval_path", cfg.data.eval_path),
             ("model.encoder", cfg.model.encoder), ("--model", model)]
    named += [("--config", str(f)) for f in experiment_files("retriever", config)]
    return [(k, str(v)) for k, v in named if v and Path(str(v)).exists()]  # a hub name is no local input


def claim(folder: Path, layout: Layout, overwrite: bool, refusal: Callable[[list[str]], str]) -> None:
    """Refuse a ``folder`` holding a result gsdistill wrote (a marker of ``layout``; ``refusal(found)``
    is the message) or files it did not write, unless ``overwrite``, which removes what gsdistill
    wrote there first (said on stderr, with the files it kept). A name the command writes that is
    not gsdistill's is refused always (:func:`gsdistill.output_folder.check_claim`)."""
    inv = check_claim(folder, _option(layout, folder), layout, overwrite, fresh=False)
    held = inv.ours_matching(layout)
    if overwrite:
        remove_earlier(folder, layout)
        return
    if held:
        raise OutputConflict(refusal(held))
    check_claim(folder, _option(layout, folder), layout, overwrite)


def _option(layout: Layout, folder: Path) -> str:
    return "run folder" if layout is RUN else "--out"


def on_rank0(action: Callable[[], None]) -> None:
    """``action()`` on rank 0; its refusal (a :class:`GsdistillError`) is raised on every rank."""
    rank, world = rank_and_world()
    error = None
    if rank == 0:
        try:
            action()
        except GsdistillError as e:
            error = (type(e), str(e))
    if world > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise error[0](error[1])


def _run_refusal(folder: Path, held: list[str]) -> str:
    resume = f"continue it with train.resume={folder}, " if (folder / "checkpoints").is_dir() else ""
    return (f"run folder {folder}: holds an earlier run ({describe(held)}); a new run would overwrite its model "
            f"and mix its metrics: {resume}choose another run.name, or pass --overwrite to remove what that run "
            "wrote (other files there stay)")


@contextmanager
def claim_run_folder(cfg: DictConfig, run_dir: Path, overwrite: bool, resumed_from: Path | None,
                     config: str | None = None) -> Iterator[Path]:
    """Hold ``run_dir`` for this training run: checked against the inputs on every rank, then locked
    and claimed on rank 0 (an earlier run refused or, with ``overwrite``, removed). A resume into the
    run's own folder (``resumed_from``: the checkpoint's run folder) continues it: nothing is removed."""
    check_output_dir(run_dir, "run folder (run.dir/run.name)", input_paths(cfg, config=config))
    if cfg.negatives.cache_dir:
        check_output_dir(cfg.negatives.cache_dir, "negatives.cache_dir", input_paths(cfg, config=config))
    same_run = resumed_from is not None and resumed_from.resolve() == run_dir.resolve()
    if overwrite and cfg.train.resume:
        raise OutputConflict(f"run folder {run_dir}: --overwrite starts the run afresh and train.resume continues it; "
                             "choose one")
    with ExitStack() as stack:
        def take() -> None:
            stack.enter_context(lock_folder(run_dir))
            if not same_run:
                claim(run_dir, RUN, overwrite, lambda held: _run_refusal(run_dir, held))
        on_rank0(take)
        yield run_dir


@contextmanager
def claim_eval_folder(out: Path, overwrite: bool, inputs: list[tuple[str, str]]) -> Iterator[Path]:
    """Hold ``retriever eval``'s ``--out``: not a file, not in or around an input (the model folder
    included), locked, and an earlier evaluation there refused unless ``overwrite`` removes it."""
    check_output_dir(out, "--out", inputs)
    with lock_folder(out):
        claim(out, EVAL, overwrite,
              lambda held: f"--out {out}: holds an earlier evaluation ({describe(held)}); give another --out, "
                           "or pass --overwrite to replace it (other files stay)")
        yield out
