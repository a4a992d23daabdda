"""The training loop: it only steps, logs and checkpoints (the model computes the named losses).

Per step: next batch -> ``engine.forward`` (named terms) -> finite check on every rank ->
``engine.backward_step`` at the scheduled learning rate (returns the pre-clip grad norm) -> EMA
teacher at the scheduled momentum -> log every ``log_every`` steps -> checkpoint every
``ckpt_every`` steps, at the end, at ``stop_after`` and on SIGINT/SIGTERM.

The run stops with :class:`TrainingDiverged` before any bad state reaches a checkpoint: a NaN/inf
loss stops it before the update; weights that turn non-finite or whose global norm grows more than
``WEIGHT_GROWTH_LIMIT``-fold in one step (a far too high learning rate: the loss can stay finite
for a while on exploded weights) stop it before that step's checkpoint. A batch that itself holds
NaN/inf (a damaged cached embedding) stops it with :class:`NonFiniteBatch`, naming the pages.
Pruning removes only this run's own checkpoints, by step number.
"""
from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path

import torch
from torch.profiler import record_function
from tqdm import tqdm

from gsdistill.errors import InputError
from gsdistill.pretrain import checkpoint
from gsdistill.pretrain.data_stream import to_device
from gsdistill.pretrain.distributed import any_rank, mean_over_ranks
from gsdistill.pretrain.metrics_log import MetricsLog, plot_metrics
from gsdistill.pretrain.schedules import cosine_with_warmup, teacher_momentum


class TrainingDiverged(RuntimeError):
    """A loss term became NaN/inf; the run stopped before applying that update."""


class NonFiniteBatch(TrainingDiverged):
    """The input batch holds NaN/inf values: the data is at fault, not the optimisation."""


class TrainingInterrupted(RuntimeError):
    """SIGINT/SIGTERM: a checkpoint was written and the run stopped."""


# A healthy AdamW step moves the global weight norm by ~1% (each weight by about lr); one that
# multiplies it several-fold is an exploded update, even when the next loss is still finite.
WEIGHT_GROWTH_LIMIT = 4.0


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


class Trainer:
    def __init__(self, cfg, run_dir: Path, engine, batches, rank: int = 0, world: int = 1,
                 device: torch.device = torch.device("cpu")):
        self.cfg, self.run_dir, self.engine, self.batches = cfg, Path(run_dir), engine, batches
        self.rank, self.world, self.device = rank, world, device
        self.ckpt_root = self.run_dir / "checkpoints"
        self.step = 0
        self.last_checkpoint: Path | None = None
        self.own_checkpoints: list[Path] = []  # this run's (and its resumed run's) checkpoints, oldest first
        self.history: list[dict] = []  # every step's logged values (rank-averaged), for tests / benches
        self._signal: int | None = None
        self._weight_norm: float | None = None

    # ---- checkpoints -----------------------------------------------------------------------
    def save(self, metrics: dict | None = None) -> Path:
        folder = checkpoint.tmp_dir(self.ckpt_root, self.step)
        self.engine.save(folder, self.rank)
        checkpoint.write_rng(folder, self.rank)
        if self.world > 1:
            torch.distributed.barrier()
        final = self.ckpt_root / checkpoint.checkpoint_name(self.step)
        self.own_checkpoints = [p for p in self.own_checkpoints if p != final] + [final]
        if self.rank == 0:
            state = {"step": self.step, "data_position": self.batches.position, "world_size": self.world,
                     "metrics": metrics or {}, "engine": self.cfg["train"]["engine"]}
            checkpoint.finalize(self.ckpt_root, self.step, state, self.cfg)
            self.own_checkpoints = checkpoint.prune(self.own_checkpoints, int(self.cfg["train"]["keep_checkpoints"]))
        if self.world > 1:
            torch.distributed.barrier()
        self.last_checkpoint = final
        return self.last_checkpoint

    def resume(self, path: str | Path) -> None:
        """Continue from ``path`` (a run dir, ``checkpoints/`` dir or checkpoint folder); a damaged
        newest checkpoint of a run dir is skipped for the newest intact one, with a message."""
        ckpt, notes = checkpoint.find_resumable(path)
        if notes and self.rank == 0:
            print(f"[pretrain] resume: {'; '.join(notes)}; resuming from the newest intact checkpoint {ckpt}",
                  file=sys.stderr)
        state = checkpoint.read_state(ckpt)
        if state.get("world_size", 1) != self.world:
            raise InputError(f"{ckpt}: written by {state.get('world_size')} ranks, resuming with {self.world} "
                             "would change the data split; resume with the same number of processes")
        self.engine.load(ckpt)
        checkpoint.restore_rng(ckpt, self.rank)
        self.batches.restore(state["data_position"])
        self.step = int(state["step"])
        self.last_checkpoint = ckpt
        if ckpt.parent == self.ckpt_root:  # the resumed run's checkpoints up to here are this run's history
            self.own_checkpoints = [p for p in checkpoint.checkpoints_in(self.ckpt_root)
                                    if checkpoint.step_of(p) <= self.step]

    # ---- the loop --------------------------------------------------------------------------
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

    def _check_finite(self, terms: dict) -> None:
        bad = {k: float(v) for k, v in terms.items() if not bool(torch.isfinite(v.detach()).all())}
        if any_rank(bool(bad), self.device):
            self._diverged(f"non-finite loss terms {bad or '(on another rank)'}")

    def _diverged(self, what: str, before: str = "applying the update") -> None:
        keep = self.last_checkpoint or "none written yet"
        raise TrainingDiverged(f"step {self.step}: {what}; stopped before {before}. "
                               f"Last good checkpoint: {keep}. Lower optim.lr or raise optim.warmup_steps.")

    def _check_batch(self, batch: dict) -> None:
        """NaN/inf in the inputs: name the pages and the data, not the learning rate (every rank stops)."""
        bad = non_finite_pages(batch)
        if any_rank(bool(bad), self.device):
            where = "; ".join(bad) if bad else "on another rank"
            raise NonFiniteBatch(f"step {self.step}: NaN/inf in the input batch ({where}); the data is at fault, "
                                 "not optim.lr: rebuild those pages' text cache (gsdistill tuples embed) or drop them. "
                                 f"Last good checkpoint: {self.last_checkpoint or 'none written yet'}.")

    def _check_weights(self) -> float:
        """Global student weight norm after the update; stop on non-finite or exploded weights."""
        norm, before = float(self.engine.weight_norm()), self._weight_norm
        if not math.isfinite(norm):
            self._diverged(f"the weights became NaN/inf (global norm {norm})", "checkpointing them")
        if before is not None and norm > WEIGHT_GROWTH_LIMIT * before:
            self._diverged(f"the weights exploded (global norm {before:.4g} -> {norm:.4g} in one step)",
                           "checkpointing them")
        self._weight_norm = norm
        return norm

    def fit(self) -> Path:
        cfg_t, cfg_o = self.cfg["train"], self.cfg["optim"]
        total_steps, stop_after = int(cfg_o["steps"]), cfg_t["stop_after"]
        end = min(total_steps, int(stop_after)) if stop_after is not None else total_steps
        log = MetricsLog(self.run_dir, bool(cfg_t["tensorboard"]) and self.rank == 0,
                         resume_step=self.step if self.step else None) if self.rank == 0 else None
        obj = self.cfg["objective"]
        old_handlers = self._install_signals()
        bar = tqdm(total=end, initial=self.step, disable=not cfg_t["progress"] or self.rank != 0,
                   desc="pretrain", dynamic_ncols=True)
        try:
            while self.step < end:
                t0 = time.perf_counter()
                with record_function("gsdistill.tuples"):
                    batch = to_device(next(self.batches), self.device)
                self._check_batch(batch)
                t1 = time.perf_counter()
                lr = cosine_with_warmup(self.step, total_steps, float(cfg_o["lr"]), float(cfg_o["min_lr"]),
                                        int(cfg_o["warmup_steps"]))
                try:
                    terms = self.engine.forward(batch)
                except ValueError as e:
                    if "NaN/inf" in str(e):
                        self._diverged(str(e))
                    raise
                self._check_finite(terms)
                if self._weight_norm is None:
                    self._weight_norm = float(self.engine.weight_norm())
                grad_norm = self.engine.backward_step(terms["total"], lr)
                weight_norm = self._check_weights()
                momentum = teacher_momentum(self.step, total_steps, float(obj["momentum_base"]),
                                            float(obj["momentum_end"]))
                self.engine.update_teacher(momentum)
                self.step += 1
                values = {k: float(v.detach()) for k, v in terms.items()}
                values = mean_over_ranks(values, self.device)
                values.update(lr=lr, momentum=momentum, grad_norm=grad_norm, weight_norm=weight_norm,
                              data_s=t1 - t0, step_s=time.perf_counter() - t0)
                self.history.append({"step": self.step, **values})
                if log is not None and (self.step % int(cfg_t["log_every"]) == 0 or self.step == end):
                    log.log(self.step, values)
                bar.update(1)
                bar.set_postfix(loss=f"{values['total']:.3f}", gn=f"{grad_norm:.2f}")
                if any_rank(self._signal is not None, self.device):
                    path = self.save(values)
                    raise TrainingInterrupted(f"stopped by signal at step {self.step}; checkpoint {path}; "
                                              f"continue with train.resume={self.run_dir}")
                if self.step % int(cfg_t["ckpt_every"]) == 0 or self.step == end:
                    self.save(values)
        finally:
            bar.close()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            if log is not None:
                log.close()
        if self.rank == 0 and cfg_t["plots"] and (self.run_dir / "metrics.csv").is_file():
            plot_metrics(self.run_dir / "metrics.csv", self.run_dir / "plots")
        return self.run_dir
