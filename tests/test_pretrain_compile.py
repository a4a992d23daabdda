"""``train.compile``: the whole step (student, teacher, heads, losses) is one graph, equal to eager,
and a new iBOT masking (other row counts) reuses it. Checked with the ``aot_eager`` backend (the
same capture and autograd as inductor, no code generation, so it runs in seconds on the CPU)."""
from __future__ import annotations

import copy

from pathlib import Path

import torch

from gsdistill.losses.validation import checks
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import host_indices, tensor_batch
from gsdistill.pretrain.engine_torch import TorchEngine, compile_step
from test_pretrain_train import tiny

RECIPE = ["objective.patch_spread=true", "model.ibot_separate_head=true", "model.geom_pool_grid=2",
          "objective.symmetric=true", "objective.geom_target=mean", "objective.teacher_temp=0.003",
          "objective.distill_warmup_steps=5"]


def _engine(model, compile_optional=False):
    """A CPU TorchEngine around a model compiled with a test backend (only its forward is used)."""
    engine = TorchEngine.__new__(TorchEngine)
    engine.module, engine.wrapped, engine.compiled, engine.autocast, engine.device = \
        model, model, True, False, torch.device("cpu")
    engine.compile_optional, engine.compile_failed = compile_optional, False
    return engine


def _batch(cfg, seed, dtype=torch.float64):
    batch = tensor_batch(cfg, 4, seed=seed)
    batch.update(host_indices(batch["masks"]))  # the data pipeline's host indices
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}


def float64_twins(cfg, compile_fn, seeds) -> tuple[GSDistill, GSDistill]:
    """(eager, compiled): one model and its deep copy compiled by ``compile_fn``, trained on ``seeds``'s
    batches in float64 (a difference is then the compiled graph's, not float32 rounding, which the recipe's
    teacher temperature of 0.003 amplifies to 2e-4 of a head's gradient); every loss term and every
    gradient of the compiled twin is checked equal to eager's."""
    torch._dynamo.reset()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        eager = GSDistill(cfg).train()
        compiled = copy.deepcopy(eager)
        compile_fn(compiled)
        engine = _engine(compiled)  # only its forward's dynamic marking
        with checks(False):
            for seed in seeds:
                batch = _batch(cfg, seed)
                want, got = eager(batch), engine.forward(batch)
                assert sorted(want) == sorted(got)
                for key in want:
                    torch.testing.assert_close(got[key], want[key], rtol=1e-10, atol=1e-12, msg=key)
                want["total"].backward()
                got["total"].backward()
    finally:
        torch.set_default_dtype(default)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        if p.grad is not None:  # the ramp read one step ahead made whole heads' gradients 1.5-2x
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-9, atol=1e-12, msg=lambda m: f"{name}: {m}")
    return eager, compiled


def test_compiled_step_is_one_graph_equal_to_eager():
    """The whole step compiled (inductor's graph partition without its code generation: its backward
    recomputes cheap values from the inputs, the distill ramp from steps_seen, once read one step ahead)."""
    cfg = tiny(*RECIPE)  # the real-page recipe's terms: every head, patch_spread, the distill ramp
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager_decomp_partition")(gm, example_inputs)

    eager, compiled = float64_twins(cfg, lambda model: compile_step(model, backend=counting), (0, 1, 2))
    assert len({int(b["mask_index"].shape[0]) for b in map(lambda s: _batch(cfg, s), (0, 1, 2))}) > 1
    assert len(graphs) == 1  # the whole forward, no graph break, no recompile for new masks
    assert int(compiled.steps_seen) == int(eager.steps_seen) == 3


def test_checked_first_step_runs_eager_and_the_step_compiles_once():
    """The loop's first step checks every loss input on the host; compiled, those reads broke the graph
    and the second step (checks off) compiled the whole forward again. The checked step now runs eager."""
    torch._dynamo.reset()
    cfg = tiny(*RECIPE)
    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    compile_step(model, backend=counting)
    engine = _engine(model)
    with checks(True):
        engine.forward(_batch(cfg, 0, torch.float32))["total"].backward()
    assert graphs == []  # checked: eager, nothing compiled
    with checks(False):
        for seed in (1, 2):
            engine.forward(_batch(cfg, seed, torch.float32))["total"].backward()
    assert len(graphs) == 1


def test_a_failed_compile_under_auto_trains_on_eager(capsys):
    """``auto`` on a machine whose toolchain cannot build the step (here a backend that fails as inductor
    does without a working C++ compiler) reports it and trains eager from that step on, with the model's
    state as if no compile had been tried; ``train.compile: true`` makes the same failure an error."""
    import pytest

    def broken(gm, example_inputs):
        calls.append(gm)
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    cfg = tiny(*RECIPE)
    for optional in (True, False):
        torch._dynamo.reset()
        calls = []
        torch.manual_seed(0)
        model = GSDistill(cfg).train()
        reference = GSDistill(cfg).train()
        reference.load_state_dict(model.state_dict())
        compile_step(model, backend=broken)
        engine = _engine(model, compile_optional=optional)
        if not optional:
            with checks(False), pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="C\\+\\+ compiler"):
                engine.forward(_batch(cfg, 1, torch.float32))
            continue
        with checks(False):
            for seed in (1, 2):
                torch.manual_seed(seed)
                got = engine.forward(_batch(cfg, seed, torch.float32))
                torch.manual_seed(seed)
                want = reference(_batch(cfg, seed, torch.float32))
                torch.testing.assert_close(got["total"], want["total"])
        assert len(calls) == 1 and engine.compile_failed and not engine.compiled  # tried once, then eager
        assert int(model.steps_seen) == int(reference.steps_seen) == 2
        assert "train.compile=auto: compiling the step failed" in capsys.readouterr().err


def test_compile_default_is_chosen_per_device(monkeypatch, tmp_path):
    """``train.compile: auto`` compiles in one process (one CUDA device, or the CPU with a C++ compiler
    for inductor's kernels) for a run long enough to earn the compile back (measured per device:
    compile seconds over seconds saved a step), never under several processes; true / false are obeyed
    and anything else is refused at load time, naming the key."""
    import pytest

    from gsdistill.config import load_config
    from gsdistill.pretrain import engine_torch
    from gsdistill.pretrain.engine_torch import compile_min_steps, compile_wanted

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    cache = [f"train.compile_cache={tmp_path / 'cache'}"]  # empty: every compile is cold
    monkeypatch.setattr(engine_torch.shutil, "which", lambda name: f"/usr/bin/{name}")
    for device in (cuda, cpu):
        at = load_config("pretrain", None, [f"optim.steps={compile_min_steps(device.type)}", *cache])
        below = load_config("pretrain", None, [f"optim.steps={compile_min_steps(device.type) - 1}", *cache])
        assert at["train"]["compile"] == "auto"
        assert compile_wanted(at, device) and not compile_wanted(below, device)
        assert not compile_wanted(at, device, world_size=2)
        assert compile_min_steps(device.type, warm=True) < compile_min_steps(device.type)
    # the real-page demo (600 steps) and the long benchmark (1,200) stay eager: the compile would not pay
    from omegaconf import OmegaConf
    for recipe in ("pdfs.yaml", "pdfs_long.yaml"):
        overrides = [str(o) for o in OmegaConf.load(Path(__file__).resolve().parents[1] / "configs/demo" / recipe)["pretrain"]]
        assert not compile_wanted(load_config("pretrain", None, [*overrides, *cache]), cpu), recipe
    monkeypatch.setattr(engine_torch.shutil, "which", lambda name: None)  # no C++ compiler: eager
    long_run = load_config("pretrain", None, ["optim.steps=100000", *cache])
    assert not compile_wanted(long_run, cpu) and compile_wanted(long_run, cuda)

    gpu = load_config("pretrain", "gpu_vit_s16", cache)
    assert gpu["optim"]["steps"] >= compile_min_steps("cuda")  # the GPU recipe compiles
    on, off = load_config("pretrain", None, ["train.compile=true"]), load_config("pretrain", None, ["train.compile=false"])
    assert on["train"]["compile"] is True and off["train"]["compile"] is False
    assert compile_wanted(on, cpu) and not compile_wanted(off, cuda)
    with pytest.raises(Exception, match="train.compile"):
        load_config("pretrain", None, ["train.compile=maybe"])
