"""The training loop of every trainer (pretraining, text retrievers): it only steps, logs and checkpoints.

An *engine* holds the model and its optimiser: ``forward(batch) -> {name: loss term}`` (with
``"total"``), ``backward_step(total, lr) -> grad_norm``, ``weight_norm()``, ``save(folder, rank)``,
``load(folder)`` and, with a teacher, ``update_teacher(momentum)``. A *stream* yields batches and
has a JSON ``position`` it can ``restore``. A :class:`LoopPlan` says how many steps, the schedules
and what to log; :func:`pretrain_plan` reads it from the pretraining config.

Per step: next batch (on CUDA copied to the device on a side stream during the previous step,
``gsdistill.pretrain.prefetch``) -> ``engine.forward`` -> ``engine.backward_step`` at the scheduled
learning rate -> EMA teacher -> ONE host sync after the update that fetches every term, the grad
and weight norms (averaged over ranks in the same all-reduce), whether any rank's batch holds
NaN/inf and whether a signal came -> log -> checkpoint every ``ckpt_every`` steps, at the end, at
``stop_after`` and on SIGINT/SIGTERM. This needs an engine that skips a non-finite update on the
device (``engine.guards_on_device``: the torch engine's fused AdamW); with any other engine the
terms are read before the update (a NaN/inf term stops the run before it) and the norms after it,
two host syncs. After the first step the losses' own value checks (each a host sync) are
turned off unless ``check_every_step`` (``train.debug_checks``); the loop watches the terms itself.

The run stops with :class:`TrainingDiverged` before any bad state reaches a checkpoint: a NaN/inf
loss stops it with its update skipped (on the device, or before it); weights that turn non-finite or whose global norm grows more than
``WEIGHT_GROWTH_LIMIT``-fold in one step stop it before that step's checkpoint. A batch holding
NaN/inf stops it with :class:`NonFiniteBatch`, naming the pages. Pruning removes only this run's
own checkpoints, by step number.
"""
from __future__ import annotations

import math
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch.profiler import record_function
from tqdm import tqdm

from gsdistill.errors import InputError, OutputWriteError, TrainingDiverged, TrainingInterrupted
from gsdistill.losses import validation
from gsdistill.pretrain import checkpoint, checkpoint_checks
from gsdistill.pretrain.prefetch import DeviceFeed
from gsdistill.pretrain.distributed import any_rank
from gsdistill.pretrain.metrics_log import LOSS_TERMS
from gsdistill.pretrain.schedules import cosine_with_warmup, teacher_momentum
from gsdistill.pretrain.step_profile import StepProfiler
from gsdistill.run_log import RunLog, plot_training

__all__ = ["LoopPlan", "NonFiniteBatch", "Trainer", "TrainingDiverged", "TrainingInterrupted", "pretrain_plan"]


class NonFiniteBatch(TrainingDiverged):
    """The input batch holds NaN/inf values: the data is at fault, not the optimisation."""


# A healthy AdamW step moves the global weight norm by ~1% (each weight by about lr); one that
# multiplies it several-fold is an exploded update, even when the next loss is still finite.
WEIGHT_GROWTH_LIMIT = 4.0


@dataclass
class LoopPlan:
    steps: int  # optimiser steps of the whole run (the schedules' length)
    lr_at: Callable[[int], float]  # step (0-based) -> learning rate
    momentum_at: Callable[[int], float] | None = None  # step -> teacher EMA momentum; None: no teacher
    stop_after: int | None = None  # stop (with a checkpoint) after this many steps
    log_every: int = 1
    ckpt_every: int = 0  # 0: no periodic checkpoints
    save_at_end: bool = True
    keep_checkpoints: int = 0  # 0: keep all
    tensorboard: bool = False
    progress: bool = False
    plots: bool = False
    plot_terms: tuple[str, ...] = ("total",)
    engine: str = "torch"  # recorded in each checkpoint's state.json
    name: str = "train"  # progress bar and message prefix
    check_every_step: bool = False  # keep the losses' value checks on after the first step (debugging)
    log_memory: bool = False  # a peak_mem_gb column (tools/gpu/gpu_check.py reads it)
    profile_steps: int = 0  # torch.profiler over this many steps of the loop (gsdistill.pretrain.step_profile)
    lr_key: str = "optim.lr"  # the config keys named in a TrainingDiverged message
    warmup_key: str = "optim.warmup_steps"


def pretrain_plan(cfg) -> LoopPlan:
    t, o, obj = cfg["train"], cfg["optim"], cfg["objective"]
    steps = int(o["steps"])
    return LoopPlan(
        steps=steps, stop_after=None if t["stop_after"] is None else int(t["stop_after"]),
        lr_at=lambda s: cosine_with_warmup(s, steps, float(o["lr"]), float(o["min_lr"]), int(o["warmup_steps"])),
        momentum_at=lambda s: teacher_momentum(s, steps, float(obj["momentum_base"]), float(obj["momentum_end"])),
        log_every=int(t["log_every"]), ckpt_every=int(t["ckpt_every"]), keep_checkpoints=int(t["keep_checkpoints"]),
        tensorboard=bool(t["tensorboard"]), progress=bool(t["progress"]), plots=bool(t["plots"]),
        plot_terms=LOSS_TERMS, engine=str(t["engine"]), name="pretrain",
        check_every_step=bool(t["debug_checks"]), log_memory=True, profile_steps=int(t["profile_steps"]))


def non_finite_pages(batch: dict) -> list[str]:
    """``"key of page(s) [...]"`` for every float tensor of a collated batch holding NaN/inf. View
    tensors are view-major (row r is page r % n_pages), the others page-major."""
    ids, found = list(batch.get("ids", [])), []
    n_pages = max(len(ids), 1)
    for key, value in batch.items():
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()) or bool(torch.isfinite(value).all()):
            continue
        rows = (~torch.isfinite(value.reshape(value.shape[0], -1))).any(dim=1).nonzero()[:, 0].tolist()
        pages = sorted({ids[r % n_pages] if ids else r % n_pages for r in rows}, key=str)
        found.append(f"{key} of page(s) {pages[:5]}" + (f" and {len(pages) - 5} more" if len(pages) > 5 else ""))
    return found


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory in GiB: the CUDA allocator's (a host counter, no sync), else the process's RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def batch_is_bad(batch: dict, device: torch.device) -> torch.Tensor:
    """0-dim float on ``device``: 1 when a float tensor of the batch holds NaN/inf (no host sync)."""
    flags = [(~torch.isfinite(v)).any() for v in batch.values()
             if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]
    return torch.stack(flags).any().to(device, torch.float64) if flags else torch.zeros((), dtype=torch.float64,
                                                                                        device=device)


class Trainer:
    def __init__(self, cfg, run_dir: Path, engine, batches, rank: int = 0, world: int = 1,
                 device: torch.device = torch.device("cpu"), plan: LoopPlan | None = None):
        self.cfg, self.run_dir, self.engine, self.batches = cfg, Path(run_dir), engine, batches
        self.feed = DeviceFeed(batches, device)  # on CUDA: the next batch copied while this step runs
        self.rank, self.world, self.device = rank, world, device
        self.plan = plan or pretrain_plan(cfg)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.step = 0
        self.last_checkpoint: Path | None = None
        self.own_checkpoints: list[Path] = []  # this run's (and its resumed run's) checkpoints, oldest first
        self.history: list[dict] = []  # every step's values (rank-averaged), for tests / benches
        self.host_syncs = 0  # fetches of device values by the loop itself (not counting the engine's)
        self._signal: int | None = None
        self.signalled = False  # the last step saw a signal on some rank: checkpoint and stop
        self._weight_norm: float | None = None
        self.run_info: dict = {}  # written into every checkpoint's state.json (e.g. the data it read)

    # ---- checkpoints -----------------------------------------------------------------------
    def save(self, metrics: dict | None = None) -> Path:
        folder = checkpoint.tmp_dir(self.ckpt_root, self.step)
        try:
            self.engine.save(folder, self.rank)
            checkpoint.write_rng(folder, self.rank)
        except OutputWriteError:  # a full disk: the checkpoints written before stay, this one is not left half-made
            checkpoint.discard_partial(folder)
            raise
        if self.world > 1:
            dist.barrier()
        final = self.ckpt_root / checkpoint.checkpoint_name(self.step)
        self.own_checkpoints = [p for p in self.own_checkpoints if p != final] + [final]
        if self.rank == 0:
            state = {"step": self.step, "data_position": self.feed.position, "world_size": self.world,
                     "metrics": metrics or {}, "engine": self.plan.engine, **self.run_info}
            try:
                checkpoint.finalize(self.ckpt_root, self.step, state, self.cfg)
            except OutputWriteError:
                checkpoint.discard_partial(folder)
                raise
            self.own_checkpoints = checkpoint.prune(self.own_checkpoints, self.plan.keep_checkpoints)
        if self.world > 1:
            dist.barrier()
        self.last_checkpoint = final
        return self.last_checkpoint

    def resume(self, path: str | Path) -> None:
        """Continue from ``path`` (a run dir, ``checkpoints/`` dir or checkpoint folder); a damaged
        newest checkpoint of a run dir is skipped for the newest intact one, with a message. Every
        part is checked against this run's engine before any is loaded (one line naming the file)."""
        ckpt, notes = checkpoint.find_resumable(path)
        if notes and self.rank == 0:
            print(f"[{self.plan.name}] resume: {'; '.join(notes)}; resuming from the newest intact checkpoint "
                  f"{ckpt}", file=sys.stderr)
        state = checkpoint.read_state(ckpt)
        if state.get("world_size", 1) != self.world:
            raise InputError(f"{ckpt}: written by {state.get('world_size')} ranks, resuming with {self.world} "
                             "would change the data split; resume with the same number of processes")
        checkpoint_checks.check_parts(ckpt, state, self.engine, self.rank)
        self.engine.load(ckpt)
        checkpoint.restore_rng(ckpt, self.rank)
        self.feed.restore(state["data_position"])
        self.step = int(state["step"])
        self.last_checkpoint = ckpt
        if ckpt.parent == self.ckpt_root:  # the resumed run's checkpoints up to here are this run's history
            self.own_checkpoints = [p for p in checkpoint.checkpoints_in(self.ckpt_root)
                                    if checkpoint.step_of(p) <= self.step]

    # ---- checks ----------------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        self._signal = signum

    def _install_signals(self) -> dict:
        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                old[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: the launcher handles signals
                pass
        return old

    def _diverged(self, what: str, before: str = "applying the update") -> None:
        keep, p = self.last_checkpoint or "none written yet", self.plan
        raise TrainingDiverged(f"step {self.step}: {what}; stopped before {before}. "
                               f"Last good checkpoint: {keep}. Lower {p.lr_key} or raise {p.warmup_key}.")

    def _bad_batch(self, batch: dict) -> None:
        bad = non_finite_pages(batch)
        where = "; ".join(bad) if bad else "on another rank"
        raise NonFiniteBatch(f"step {self.step}: NaN/inf in the input batch ({where}); the data is at fault, "
                             f"not {self.plan.lr_key}: rebuild those pages' text cache (gsdistill tuples embed) or "
                             f"drop them. Last good checkpoint: {self.last_checkpoint or 'none written yet'}.")

    def _fetch_terms(self, terms: dict, batch_bad: torch.Tensor,
                     norms: tuple = ()) -> tuple[dict[str, float], bool, bool, list[float]]:
        """One host sync: every term averaged over ranks, whether any rank's batch held NaN/inf or got
        a signal, and the ``norms`` (identical on every rank) when given (one all-reduce of one
        vector; NaN anywhere stays NaN)."""
        keys = list(terms)  # the engine's order, the same on every rank
        parts = [torch.as_tensor(terms[k], dtype=torch.float64, device=self.device).detach().reshape(())
                 for k in keys]
        parts += [torch.as_tensor(n, dtype=torch.float64, device=self.device).detach().reshape(()) for n in norms]
        parts += [batch_bad, torch.tensor(float(self._signal is not None), dtype=torch.float64, device=self.device)]
        packed = torch.stack(parts)
        if self.world > 1:
            dist.all_reduce(packed)
            packed[:-2] /= self.world
        with record_function("gsdistill.sync"):  # the wait for the device (step_profile's phases)
            *vals, bad, sig = packed.tolist()
        self.host_syncs += 1
        return dict(zip(keys, vals[:len(keys)])), bad > 0, sig > 0, vals[len(keys):]

    def _fetch_norms(self, grad_norm, weight_norm) -> tuple[float, float]:
        """The one host sync after the update (engines may return tensors or floats)."""
        if isinstance(grad_norm, torch.Tensor) or isinstance(weight_norm, torch.Tensor):
            self.host_syncs += 1
            both = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=self.device).reshape(())
                                for v in (grad_norm, weight_norm)])
            return tuple(both.tolist())
        return float(grad_norm), float(weight_norm)

    def _check_weights(self, norm: float) -> None:
        """Stop on non-finite or exploded weights (global student weight norm after the update)."""
        before = self._weight_norm
        if not math.isfinite(norm):
            self._diverged(f"the weights became NaN/inf (global norm {norm})", "checkpointing them")
        if before is not None and norm > WEIGHT_GROWTH_LIMIT * before:
            self._diverged(f"the weights exploded (global norm {before:.4g} -> {norm:.4g} in one step)",
                           "checkpointing them")
        self._weight_norm = norm

    # ---- the loop --------------------------------------------------------------------------
    def _checked_update(self, batch: dict, terms: dict, lr: float, momentum: float | None) -> tuple:
        """Read the terms back, then update (engines that cannot skip an update on the device): a
        NaN/inf term stops the run before the update; the norms are a second read after it."""
        values, batch_bad, signalled, _ = self._fetch_terms(terms, batch_is_bad(batch, self.device))
        self._raise_if_bad(batch, values, batch_bad)
        grad_norm = self.engine.backward_step(terms["total"], lr)
        grad_norm, weight_norm = self._fetch_norms(grad_norm, self.engine.weight_norm())
        self._check_weights(weight_norm)
        if momentum is not None:
            self.engine.update_teacher(momentum)
        return values, grad_norm, weight_norm, signalled

    def _guarded_update(self, batch: dict, terms: dict, lr: float, momentum: float | None) -> tuple:
        """Backward, update and EMA queued at once, with no host sync between forward and backward:
        the engine skips the optimizer and EMA updates on the device when the gradient norm is not
        finite (the same on every rank after the gradient all-reduce). One read after it all: terms,
        batch flag, signal and norms; a bad step stops the run with its update already skipped."""
        grad_norm = self.engine.backward_step(terms["total"], lr)
        if momentum is not None:
            self.engine.update_teacher(momentum)
        values, batch_bad, signalled, (grad_norm, weight_norm) = self._fetch_terms(
            terms, batch_is_bad(batch, self.device), (grad_norm, self.engine.weight_norm()))
        self._raise_if_bad(batch, values, batch_bad, "the update was skipped on the device")
        if not math.isfinite(grad_norm):
            self._diverged(f"NaN/inf gradients (global norm {grad_norm}); the update was skipped on the device")
        self._check_weights(weight_norm)
        return values, grad_norm, weight_norm, signalled

    def _raise_if_bad(self, batch: dict, values: dict, batch_bad: bool, note: str = "") -> None:
        if batch_bad:
            self._bad_batch(batch)
        bad = [k for k, v in values.items() if not math.isfinite(v)]
        if bad:
            self._diverged(f"NaN/inf loss terms {bad}" + (" (on at least one rank)" if self.world > 1 else "")
                           + (f"; {note}" if note else ""))

    def _one_step(self) -> dict:
        p = self.plan
        t0 = time.perf_counter()
        with record_function("gsdistill.data"):
            batch = next(self.feed)
        checks = validation.checks_enabled()
        if checks and any_rank(bool(non_finite_pages(batch)), self.device):  # first step: before the losses see it
            self._bad_batch(batch)
        t1 = time.perf_counter()
        lr = p.lr_at(self.step)
        terms = self.engine.forward(batch)
        if self._weight_norm is None:
            self._weight_norm = float(self.engine.weight_norm())
        extra = {"momentum": p.momentum_at(self.step)} if p.momentum_at is not None else {}
        if getattr(self.engine, "guards_on_device", False):
            values, grad_norm, weight_norm, signalled = self._guarded_update(batch, terms, lr, extra.get("momentum"))
        else:
            values, grad_norm, weight_norm, signalled = self._checked_update(batch, terms, lr, extra.get("momentum"))
        if checks and not p.check_every_step:
            validation.set_checks(False)  # one good step seen: the loop watches the terms from here on
        self.step += 1
        values.update(batch.get("log", {}))
        values.update(lr=lr, **extra, grad_norm=grad_norm, weight_norm=weight_norm, data_s=t1 - t0,
                      step_s=time.perf_counter() - t0, **({"peak_mem_gb": peak_memory_gb(self.device)}
                                                          if p.log_memory else {}))
        self.history.append({"step": self.step, **values})
        self.signalled = signalled
        return values

    def fit(self) -> Path:
        p = self.plan
        end = min(p.steps, p.stop_after) if p.stop_after is not None else p.steps
        log = RunLog(self.run_dir, p.tensorboard, resume_step=self.step or None) if self.rank == 0 else None
        old_handlers = self._install_signals()
        checks_before = validation.checks_enabled()
        bar = tqdm(total=end, initial=self.step, disable=not p.progress or self.rank != 0, desc=p.name,
                   dynamic_ncols=True)
        profiler = StepProfiler(self.run_dir, p.profile_steps if self.rank == 0 else 0, self.device)
        try:
            while self.step < end:
                values = self._one_step()
                # a signal stops at this step with a checkpoint: its row is logged like the last one's
                if log is not None and (self.step % p.log_every == 0 or self.step == end or self.signalled):
                    with record_function("gsdistill.log"):
                        log.log(self.step, values)
                bar.update(1)
                bar.set_postfix(loss=f"{values['total']:.3f}", gn=f"{values['grad_norm']:.2f}")
                if self.signalled:
                    path = self.save(values)
                    raise TrainingInterrupted(f"stopped by signal at step {self.step}; checkpoint {path}; "
                                              f"continue with train.resume={self.run_dir}")
                periodic = p.ckpt_every > 0 and self.step % p.ckpt_every == 0
                if periodic or (self.step == end and (p.save_at_end or end < p.steps)):
                    self.save(values)
                profiler.step()
        finally:
            profiler.close()
            validation.set_checks(checks_before)
            bar.close()
            if log is not None:
                log.close()
            # last: a second Ctrl-C while closing only sets the flag again (no KeyboardInterrupt
            # traceback out of the progress bar or TensorBoard's writer)
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
        if self.rank == 0 and p.plots and (self.run_dir / "metrics.csv").is_file():
            plot_training(self.run_dir / "metrics.csv", self.run_dir / "plots", p.plot_terms)
        return self.run_dir
