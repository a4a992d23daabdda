"""The training loop: it only steps, logs and checkpoints (the model computes the named losses).

Per step: next batch -> ``engine.forward`` (named terms) -> finite check on every rank ->
``engine.backward_step`` at the scheduled learning rate (returns the pre-clip grad norm) -> EMA
teacher at the scheduled momentum -> log every ``log_every`` steps -> checkpoint every
``ckpt_every`` steps, at the end, at ``stop_after`` and on SIGINT/SIGTERM. A NaN/inf loss stops the
run with :class:`TrainingDiverged` before the bad update, leaving the last good checkpoint as it was.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path

import torch
from torch.profiler import record_function
from tqdm import tqdm

from gsdistill.train import checkpoint
from gsdistill.train.data_stream import to_device
from gsdistill.train.distributed import any_rank, mean_over_ranks
from gsdistill.train.metrics_log import MetricsLog, plot_metrics
from gsdistill.train.schedules import cosine_with_warmup, teacher_momentum


class TrainingDiverged(RuntimeError):
    """A loss term became NaN/inf; the run stopped before applying that update."""


class TrainingInterrupted(RuntimeError):
    """SIGINT/SIGTERM: a checkpoint was written and the run stopped."""


class Trainer:
    def __init__(self, cfg, run_dir: Path, engine, batches, rank: int = 0, world: int = 1,
                 device: torch.device = torch.device("cpu")):
        self.cfg, self.run_dir, self.engine, self.batches = cfg, Path(run_dir), engine, batches
        self.rank, self.world, self.device = rank, world, device
        self.ckpt_root = self.run_dir / "checkpoints"
        self.step = 0
        self.last_checkpoint: Path | None = None
        self.history: list[dict] = []  # every step's logged values (rank-averaged), for tests / benches
        self._signal: int | None = None

    # ---- checkpoints -----------------------------------------------------------------------
    def save(self, metrics: dict | None = None) -> Path:
        folder = checkpoint.tmp_dir(self.ckpt_root, self.step)
        self.engine.save(folder, self.rank)
        checkpoint.write_rng(folder, self.rank)
        if self.world > 1:
            torch.distributed.barrier()
        if self.rank == 0:
            state = {"step": self.step, "data_position": self.batches.position, "world_size": self.world,
                     "metrics": metrics or {}, "engine": self.cfg["train"]["engine"]}
            checkpoint.finalize(self.ckpt_root, self.step, state, self.cfg, int(self.cfg["train"]["keep_checkpoints"]))
        if self.world > 1:
            torch.distributed.barrier()
        self.last_checkpoint = self.ckpt_root / checkpoint.checkpoint_name(self.step)
        return self.last_checkpoint

    def resume(self, path: str | Path) -> None:
        ckpt = checkpoint.resolve_checkpoint(path)
        state = checkpoint.read_state(ckpt)
        if state.get("world_size", 1) != self.world:
            raise ValueError(f"{ckpt}: written by {state.get('world_size')} ranks, resuming with {self.world} "
                             "would change the data split; resume with the same number of processes")
        self.engine.load(ckpt)
        checkpoint.restore_rng(ckpt, self.rank)
        self.batches.restore(state["data_position"])
        self.step = int(state["step"])
        self.last_checkpoint = ckpt

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

    def _diverged(self, what: str) -> None:
        keep = self.last_checkpoint or "none written yet"
        raise TrainingDiverged(f"step {self.step}: {what}; stopped before applying the update. "
                               f"Last good checkpoint: {keep}. Lower optim.lr or raise optim.warmup_steps.")

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
                with record_function("gsdistill.data"):
                    batch = to_device(next(self.batches), self.device)
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
                grad_norm = self.engine.backward_step(terms["total"], lr)
                momentum = teacher_momentum(self.step, total_steps, float(obj["momentum_base"]),
                                            float(obj["momentum_end"]))
                self.engine.update_teacher(momentum)
                self.step += 1
                values = {k: float(v.detach()) for k, v in terms.items()}
                values = mean_over_ranks(values, self.device)
                values.update(lr=lr, momentum=momentum, grad_norm=grad_norm,
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
