"""``train.profile_steps``: ``torch.profiler`` over a few steps of the real training loop, data
loading, host syncs and logging included (what a bare engine benchmark cannot show).

On one lent H200 the loop with 8 DataLoader workers stepped in 0.338 s where the same engine step
on the same batches, fed from pinned memory without a DataLoader, took about a quarter of that
(docs/benchmarks.md); a profile of the loop itself says where the main thread's time goes.

The first ``SKIP`` steps are left out (the first step runs the input checks and cuDNN's autotuning),
one more warms the profiler up, then ``steps`` are recorded. Written to ``run_dir/profile/``:

- ``top_ops.txt``: wall, operator CPU and device milliseconds per profiled step; the loop's phases
  (its ``gsdistill.*`` ranges: data, the model's parts, backward, optimizer, EMA, the wait for the
  device at the step's one read, logging); then the operators and kernels ranked by self CPU time (the main thread: launches, copies, waits such as
  ``cudaStreamSynchronize``) and, on CUDA, by self device time;
- ``trace.json``: the Chrome trace (``chrome://tracing`` or https://ui.perfetto.dev).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

SKIP = 2  # steps before the profiler warms up


def self_device_us(event) -> float:
    """An event's self time on the device in µs (torch renamed ``cuda`` to ``device`` in these fields)."""
    return float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0))


def ranked_table(events, key, steps: int, top: int) -> list[str]:
    """``ms/step  calls/step  name`` for the ``top`` events by ``key`` (µs totals)."""
    ranked = sorted((e for e in events if key(e) > 0), key=key, reverse=True)[:top]
    return [f"{key(e) / steps / 1e3:10.3f} {e.count / steps:10.1f}  {e.key[:110]}" for e in ranked]


class StepProfiler:
    """Call :meth:`step` after every training step; it records ``steps`` of them and writes the report."""

    def __init__(self, run_dir: Path, steps: int, device: torch.device, top: int = 30):
        self.out, self.steps, self.top = Path(run_dir) / "profile", int(steps), top
        self.cuda = device.type == "cuda"
        self.seen, self.written = 0, False
        self.prof = None
        if self.steps <= 0:
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.prof = profile(activities=activities, schedule=schedule(skip_first=SKIP, wait=0, warmup=1,
                                                                     active=self.steps, repeat=1),
                            on_trace_ready=self._write)
        self.prof.start()
        self._t0: float | None = None

    def step(self) -> None:
        if self.prof is None or self.written:
            return
        self.seen += 1
        if self.seen == SKIP + 1:  # the warm-up step has just ended: the recorded steps start now
            self._t0 = time.perf_counter()
        self.prof.step()

    def _write(self, prof) -> None:
        recorded = min(self.steps, self.seen - SKIP - 1)  # fewer when the run ends inside the schedule
        if recorded <= 0:
            return
        if self.cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - self._t0) * 1e3 / recorded
        self.out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out / "trace.json"))
        events = prof.key_averages()
        cpu_ms = sum(e.self_cpu_time_total for e in events) / recorded / 1e3
        lines = [f"{recorded} profiled steps (after {SKIP} skipped and 1 warm-up): wall {wall_ms:.1f} ms/step, "
                 f"operators' self CPU time {cpu_ms:.1f} ms/step"
                 + (f", device time {sum(self_device_us(e) for e in events) / recorded / 1e3:.1f} ms/step"
                    if self.cuda else ""), "",
                 "The loop's phases (CPU ms/step including what they call, calls/step, name; gsdistill.sync is the "
                 "wait for the device at the step's one read):",
                 *ranked_table([e for e in events if e.key.startswith("gsdistill.")],
                               lambda e: float(e.cpu_time_total), recorded, self.top), "",
                 "By self CPU time (ms/step, calls/step, name):",
                 *ranked_table(events, lambda e: float(e.self_cpu_time_total), recorded, self.top)]
        if self.cuda:
            lines += ["", "By self device time (ms/step, calls/step, name):",
                      *ranked_table(events, self_device_us, recorded, self.top)]
        (self.out / "top_ops.txt").write_text("\n".join(lines) + "\n")
        self.written = True

    def close(self) -> None:
        """Stop the profiler; a run that ends inside the recorded steps writes the ones it recorded."""
        if self.prof is not None and not self.written:
            self.prof.stop()
        self.prof = None
