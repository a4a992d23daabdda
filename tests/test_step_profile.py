"""``train.profile_steps``'s report (gsdistill.pretrain.step_profile): the same rows as torch's
``key_averages`` on a real profile, read in one pass over the raw events (linear in their number), and
written by a compiled run, whose deep event trees made ``key_averages`` run for minutes on an H200."""
from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from gsdistill.pretrain import step_profile
from gsdistill.pretrain.step_profile import read_events, summarise


def _work():
    x = torch.randn(64, 64)
    for _ in range(3):
        with record_function("gsdistill.data"):
            y = x @ x
        with record_function("gsdistill.backward"):
            with record_function("inner.part"):
                y = torch.relu(y).sum(0)
            y = y * 2


def test_summary_equals_key_averages_on_a_real_profile():
    """Phases: inclusive time and calls; every operator: self time and calls, as torch nests them."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _work()
    summary = summarise(read_events(prof))
    averages = {e.key: e for e in prof.key_averages()}
    assert set(summary["phases"]) == {"gsdistill.data", "gsdistill.backward"}
    for name, (us, calls) in summary["phases"].items():
        assert calls == averages[name].count == 3
        assert abs(us - averages[name].cpu_time_total) <= 2 * calls  # µs rounding of each event's ends
    for name in ("aten::mm", "aten::relu", "inner.part", "aten::sum", "gsdistill.backward"):
        us, calls = summary["self_cpu"][name]
        assert calls == averages[name].count
        assert abs(us - averages[name].self_cpu_time_total) <= 4 * calls + 2, name
    assert summary["device"] == {}  # no device events on the CPU


OPS = 980  # per step: a phase, its wrappers, 980 ops and their 980 kernels


def _synthetic(steps: int, depth: int) -> list[tuple]:
    """``steps`` steps shaped like a compiled step's: a phase holding a chain of nested ranges ``depth``
    deep (autograd and compiled-graph wrappers) whose innermost ops each launch one kernel."""
    events, t = [], 0
    for _ in range(steps):
        start, ops = t, OPS
        chain_end = start + 10 * (ops + depth) + 10
        events.append(("gsdistill.model", 1, start, chain_end + 5, False))
        for d in range(depth):
            events.append((f"wrapper.{d}", 1, start + d + 1, chain_end - d, False))
        t = start + depth + 2
        for i in range(ops):
            events.append((f"aten::op{i % 50}", 1, t, t + 8, False))
            events.append((f"kernel_{i % 80}", 7, t + 3, t + 13, True))
            t += 10
        t = chain_end + 10
    return events


class _Counted:
    """An iterable that counts how often it is iterated and how many items it hands out."""

    def __init__(self, items):
        self.items, self.passes, self.handed = items, 0, 0

    def __iter__(self):
        self.passes += 1
        for item in self.items:
            self.handed += 1
            yield item


def _seconds(events) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        summarise(events)
        best = min(best, time.process_time() - t)
    return best


def test_summary_reads_each_event_once_and_scales_linearly():
    """About 260,000 events (a compiled step's profile on a GPU is of this order) nested 640 deep cost
    about their share of the time of 50,000 nested 40 deep: the cost does not grow with the depth
    (key_averages' recursive device totals walk each event's subtree once per ancestor, events x depth:
    16x more per event here); the events are read in one pass."""
    small, large = _synthetic(25, 40), _synthetic(100, 640)
    assert len(large) >= 200_000
    counted = _Counted(large)
    summary = summarise(counted)
    assert counted.passes == 1 and counted.handed == len(large)
    assert summary["phases"]["gsdistill.model"][1] == 100
    assert summary["device"]["kernel_0"][1] == 100 * len(range(0, OPS, 80))
    # self time of a wrapper is its span less its one child's: 2 x 10 ns per step -> 0.02 µs x 100 steps
    assert abs(summary["self_cpu"]["wrapper.3"][0] - 100 * 0.002) < 1e-6
    # linear: the event ratio (5.2) and a sort's log factor; events x depth: over 50
    assert _seconds(large) < 2.5 * len(large) / len(small) * _seconds(small)


def test_a_compiled_run_writes_its_report_with_the_phase_rows(tmp_path, monkeypatch):
    """A compiled pretraining run (dynamo + AOTAutograd's graphs; ``aot_eager``: no code generation) with
    ``train.profile_steps=2`` writes the report; its phase rows are key_averages' rows of the same
    profile (names and calls), as the report had them before."""
    from gsdistill.pretrain import engine_torch
    from gsdistill.pretrain.run import run_pretraining
    from test_pretrain_train import fixed, tiny

    torch._dynamo.reset()
    real = engine_torch.compile_step
    monkeypatch.setattr(engine_torch, "compile_step", lambda model, scope, mode, **_: real(
        model, backend="aot_eager", scope=scope, mode=None))
    seen = {}
    write = step_profile.StepProfiler._write

    def both(self, prof):
        write(self, prof)
        seen.update({e.key: e.count for e in prof.key_averages() if e.key.startswith("gsdistill.")})

    monkeypatch.setattr(step_profile.StepProfiler, "_write", both)
    cfg = tiny("optim.steps=6", "train.compile=true", "train.compile_scope=step", "train.profile_steps=2",
               f"train.compile_cache={tmp_path / 'cache'}")
    run = run_pretraining(cfg, tmp_path / "run", fixed(cfg))
    report = (run / "profile" / "top_ops.txt").read_text()
    assert report.startswith("2 profiled steps (after 2 skipped and 1 warm-up)")
    phases = report.split("\n\n")[1].splitlines()[1:]
    rows = {line.split()[-1]: float(line.split()[1]) for line in phases}
    assert {"gsdistill.data", "gsdistill.sync", "gsdistill.backward", "gsdistill.optimizer",
            "gsdistill.ema"} <= set(rows)
    assert rows == {name: count / 2 for name, count in seen.items()}
    assert "CompiledFunction" in report  # the compiled graph ran in the profiled steps
