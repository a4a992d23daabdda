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
  ``cudaStreamSynchronize``) and, on CUDA, the kernels by device time;
- ``trace.json``: the Chrome trace (``chrome://tracing`` or https://ui.perfetto.dev).

The report reads the profiler's raw (kineto) events once, in one sort and one pass
(:func:`summarise`). torch's own ``key_averages`` first builds a ``FunctionEvent`` tree and then
sums each event's device time recursively over its whole subtree, again for every child's "self"
share: on a compiled step's deep trees of events that ran for more than 76 s on an H200 (issue 57).
"""
from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

SKIP = 2  # steps before the profiler warms up
PHASE_PREFIX = "gsdistill."
_SKIPPED_NAMES = ("[memory]", "[OutOfMemory]")  # allocation records, not time


def read_events(prof) -> list[tuple[str, int, int, int, bool]]:
    """The recorded events as ``(name, thread, start_ns, end_ns, on_device)``, read once from the
    profiler's kineto results (never through ``prof.events()``, which builds the event tree)."""
    out = []
    for e in prof.profiler.kineto_results.events():
        name, on_device = e.name(), e.device_type() != DeviceType.CPU
        if e.is_async() or e.is_python_function() or name in _SKIPPED_NAMES:
            continue
        if on_device and "user_annotation" in str(e.activity_type()):
            continue  # a record_function range drawn on the device's timeline: its kernels are counted already
        start = e.start_ns()
        out.append((name, e.start_thread_id(), start, start + e.duration_ns(), on_device))
    return out


def summarise(events) -> dict[str, dict[str, list[float]]]:
    """``{"phases" | "self_cpu" | "device": {name: [µs, calls]}}`` from ``(name, thread, start_ns, end_ns,
    on_device)`` tuples: the loop's ``gsdistill.*`` ranges with their inclusive time, every host event's
    self time (its time less that of the events nested in it on its thread, as ``key_averages``
    nests them), every device event (kernels, copies) with its time. One sort, one pass: linear in
    the events up to the sort's log factor."""
    phases, self_cpu, device = (defaultdict(lambda: [0.0, 0]) for _ in range(3))
    host = []
    for ev in events:
        name, _thread, start, end, on_device = ev
        if on_device:
            row = device[name]
            row[0] += (end - start) / 1e3
            row[1] += 1
        else:
            host.append(ev)
    host.sort(key=lambda e: (e[1], e[2], -e[3]))  # by thread, then outer before inner at the same start
    stack: list[list] = []  # open events of this thread: [end_ns, row of self_cpu]
    thread = None
    for name, tid, start, end, _ in host:
        if tid != thread:
            stack, thread = [], tid
        while stack and stack[-1][0] <= start:
            stack.pop()
        us = (end - start) / 1e3
        if stack and end <= stack[-1][0]:  # nested in the innermost open event: not its self time
            stack[-1][1][0] -= us
        row = self_cpu[name]
        row[0] += us
        row[1] += 1
        if name.startswith(PHASE_PREFIX):
            phase = phases[name]
            phase[0] += us
            phase[1] += 1
        stack.append([end, row])
    return {"phases": dict(phases), "self_cpu": dict(self_cpu), "device": dict(device)}


def ranked_table(rows: dict[str, list[float]], steps: int, top: int) -> list[str]:
    """``ms/step  calls/step  name`` for the ``top`` rows by time (µs totals)."""
    ranked = sorted(((us, calls, name) for name, (us, calls) in rows.items() if us > 0), reverse=True)[:top]
    return [f"{us / steps / 1e3:10.3f} {calls / steps:10.1f}  {name[:110]}" for us, calls, name in ranked]


def report_lines(summary: dict, recorded: int, wall_ms: float, top: int, cuda: bool, read: str = "") -> list[str]:
    """The report's text; ``read``: a second header line (how long the report took)."""
    cpu_ms = sum(us for us, _ in summary["self_cpu"].values()) / recorded / 1e3
    device_ms = sum(us for us, _ in summary["device"].values()) / recorded / 1e3
    device = f", device time {device_ms:.1f} ms/step" if cuda else ""
    lines = [f"{recorded} profiled steps (after {SKIP} skipped and 1 warm-up): wall {wall_ms:.1f} ms/step, "
             f"operators' self CPU time {cpu_ms:.1f} ms/step{device}", *([read] if read else []), "",
             "The loop's phases (CPU ms/step including what they call, calls/step, name; gsdistill.sync is the "
             "wait for the device at the step's one read):",
             *ranked_table(summary["phases"], recorded, top), "",
             "By self CPU time (ms/step, calls/step, name):",
             *ranked_table(summary["self_cpu"], recorded, top)]
    if cuda:
        lines += ["", "By device time (kernels and copies; ms/step, calls/step, name):",
                  *ranked_table(summary["device"], recorded, top)]
    return lines


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
        t0 = time.perf_counter()
        self.out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out / "trace.json"))
        events = read_events(prof)
        summary = summarise(events)
        read = f"This report: {len(events):,} events read once, trace and tables in {time.perf_counter() - t0:.1f} s."
        lines = report_lines(summary, recorded, wall_ms, self.top, self.cuda, read)
        (self.out / "top_ops.txt").write_text("\n".join(lines) + "\n")
        self.written = True

    def close(self) -> None:
        """Stop the profiler; a run that ends inside the recorded steps writes the ones it recorded."""
        if self.prof is not None and not self.written:
            self.prof.stop()
        self.prof = None
