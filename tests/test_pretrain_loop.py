"""The shared training loop with a toy engine: two host syncs per step, the losses' value checks off
after the first step (on with ``check_every_step``), a NaN loss stops it before the update with
``TrainingDiverged``, and the one device resolver."""
from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from gsdistill.errors import GsdistillError, InputError, TrainingDiverged
from gsdistill.losses import validation
from gsdistill.pretrain.data_stream import FixedBatches
from gsdistill.device import resolve_device
from gsdistill.pretrain.loop import LoopPlan, Trainer


class ToyEngine:
    """Least squares on a linear layer; every returned value stays a tensor (no sync of its own)."""

    def __init__(self, nan_at: int | None = None):
        torch.manual_seed(0)
        self.module = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.nan_at, self.calls, self.checks, self.weights = nan_at, 0, [], []

    def forward(self, batch):
        self.calls += 1
        self.checks.append(validation.checks_enabled())
        self.weights.append([p.detach().clone() for p in self.module.parameters()])
        loss = ((self.module(batch["x"]) - batch["y"]) ** 2).mean()
        if self.calls == self.nan_at:
            loss = loss * float("nan")
        return {"total": loss, "fit": loss.detach()}

    def backward_step(self, total, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad()
        total.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), float("inf"))
        self.optimizer.step()
        return norm

    def weight_norm(self):
        return torch.linalg.vector_norm(torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]))


def _trainer(tmp_path, engine, steps=5, **plan) -> Trainer:
    g = torch.Generator().manual_seed(1)
    batches = [{"ids": [f"p{i}" for i in range(8)], "x": torch.randn(8, 4, generator=g),
                "y": torch.randn(8, 1, generator=g)} for _ in range(3)]
    return Trainer(OmegaConf.create({}), tmp_path, engine, FixedBatches(batches), plan=LoopPlan(
        steps=steps, lr_at=lambda s: 0.1, log_every=100, save_at_end=False, **plan))


def test_two_host_syncs_per_step_and_checks_off_after_the_first(tmp_path, monkeypatch):
    engine = ToyEngine()
    trainer = _trainer(tmp_path, engine)
    syncs, per_step = [0], []
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **k):
            syncs[0] += 1
            return _real(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, counted)
    real_forward = engine.forward
    monkeypatch.setattr(engine, "forward", lambda b: (per_step.append(syncs[0]), real_forward(b))[1])
    assert validation.checks_enabled()
    trainer.fit()
    steps = [b - a for a, b in zip(per_step, per_step[1:] + [syncs[0]])]
    # after the first step (which also scans the batch and reads the initial weight norm): exactly
    # one fetch of the terms before the update and one of the grad / weight norms after it
    assert steps[1:] == [2, 2, 2, 2] and trainer.host_syncs == 10
    assert engine.checks == [True, False, False, False, False] and validation.checks_enabled()
    assert [r["step"] for r in trainer.history] == [1, 2, 3, 4, 5]
    assert trainer.history[0]["total"] == trainer.history[0]["fit"] > trainer.history[3]["total"]


def test_check_every_step_keeps_the_losses_checks_on(tmp_path):
    engine = ToyEngine()
    _trainer(tmp_path, engine, steps=3, check_every_step=True).fit()
    assert engine.checks == [True, True, True] and validation.checks_enabled()


def test_pretrain_config_key_debug_checks_sets_check_every_step():
    from gsdistill.config import load_config
    from gsdistill.pretrain.loop import pretrain_plan
    assert pretrain_plan(load_config("pretrain")).check_every_step is False
    assert pretrain_plan(load_config("pretrain", None, ["train.debug_checks=true"])).check_every_step is True


def test_nan_loss_raises_training_diverged_before_the_update(tmp_path):
    engine = ToyEngine(nan_at=3)
    trainer = _trainer(tmp_path, engine)
    with pytest.raises(TrainingDiverged, match=r"step 2: NaN/inf loss terms \['total', 'fit'\].*Last good "
                                               r"checkpoint: none written yet\. Lower optim.lr") as info:
        trainer.fit()
    assert isinstance(info.value, GsdistillError) and trainer.step == 2
    after = [p.detach() for p in engine.module.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, engine.weights[2]))  # the NaN step changed nothing
    assert not all(torch.equal(a, b) for a, b in zip(after, engine.weights[1]))
    assert validation.checks_enabled()  # restored on the way out


def test_resolve_device():
    assert resolve_device(None) == resolve_device("auto") == resolve_device("")
    assert resolve_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 0)
        assert resolve_device("cuda", local_rank=0) == torch.device("cuda", 0)
        assert resolve_device(f"cuda:{torch.cuda.device_count() - 1}").index == torch.cuda.device_count() - 1
        with pytest.raises(InputError, match="only"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
    else:
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(InputError, match="no CUDA device"):
            resolve_device("cuda:0")
    with pytest.raises(InputError, match="auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")


def test_pretraining_steps_sync_the_host_twice_in_the_loop(tmp_path):
    from gsdistill.losses.syncs import HostSyncCounter
    from gsdistill.pretrain.run import run_pretraining
    from test_pretrain_train import fixed, tiny

    def loop_syncs(steps: int) -> dict[str, int]:
        cfg = tiny(f"optim.steps={steps}")
        with HostSyncCounter() as syncs:
            run_pretraining(cfg, tmp_path / f"s{steps}", fixed(cfg))
        return syncs.inside("gsdistill/pretrain/loop.py")  # {"op @ file:line": count}

    two, five = loop_syncs(2), loop_syncs(5)
    # the torch engine's fused AdamW skips a non-finite step on the device: steps 3-5 add ONE read
    # each, of the terms and norms after the update; the first step's extra reads (the batch scan,
    # the initial weight norm) do not repeat
    assert sum(five.values()) - sum(two.values()) == 3 * 1
    grew = [k for k in five if five[k] != two.get(k, 0)]
    assert len(grew) == 1 and all(k.startswith("tolist @ ") for k in grew), five


def test_profile_steps_records_that_many_steps_of_the_loop(tmp_path):
    """``train.profile_steps``: the profiled steps are steps 3.. of the loop (2 skipped, 1 warm-up),
    each one data fetch and one engine forward, ranked in ``top_ops.txt``; a Chrome trace beside it."""
    from torch.profiler import record_function

    class Named(ToyEngine):
        def forward(self, batch):
            with record_function("toy.forward"):
                return super().forward(batch)

    trainer = _trainer(tmp_path, Named(), steps=8, profile_steps=3)
    trainer.fit()
    report = (tmp_path / "profile" / "top_ops.txt").read_text()
    assert report.startswith("3 profiled steps (after 2 skipped and 1 warm-up)")
    phases, *_ = report.split("\n\n")[1:]
    rows = {line.split()[-1]: float(line.split()[1]) for line in phases.splitlines()[1:]}
    assert rows["gsdistill.data"] == rows["gsdistill.sync"] == 1.0  # calls per profiled step (one read a step)
    assert "toy.forward" in report
    trace = json.loads((tmp_path / "profile" / "trace.json").read_text())
    assert sum(e.get("name") == "toy.forward" for e in trace["traceEvents"]) == 3


def test_profile_steps_in_a_run_shorter_than_its_schedule(tmp_path):
    trainer = _trainer(tmp_path, ToyEngine(), steps=5, profile_steps=4)  # steps 3 and 4 of 4 recorded
    trainer.fit()
    assert (tmp_path / "profile" / "top_ops.txt").read_text().startswith("2 profiled steps")
    short = tmp_path / "short"
    _trainer(short, ToyEngine(), steps=3, profile_steps=4).fit()  # only the skipped and warm-up steps ran
    assert not (short / "profile").exists()


def test_profile_steps_must_be_a_count():
    from gsdistill.config import ConfigError, load_config

    assert load_config("pretrain", None, [])["train"]["profile_steps"] == 0
    with pytest.raises(ConfigError, match="train.profile_steps.*must be >= 0"):
        load_config("pretrain", None, ["train.profile_steps=-1"])
