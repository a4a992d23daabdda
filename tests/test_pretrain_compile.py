"""``train.compile``: the whole step (student, teacher, heads, losses) is one graph, equal to eager,
and a new iBOT masking (other row counts) reuses it. Checked with the ``aot_eager`` backend (the
same capture and autograd as inductor, no code generation, so it runs in seconds on the CPU)."""
from __future__ import annotations

import copy

import torch

from gsdistill.losses.validation import checks
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import host_indices, tensor_batch
from gsdistill.pretrain.engine_torch import TorchEngine, compile_step
from test_pretrain_train import tiny

RECIPE = ["objective.patch_spread=true", "model.ibot_separate_head=true", "model.geom_pool_grid=2",
          "objective.symmetric=true", "objective.geom_target=mean", "objective.teacher_temp=0.003",
          "objective.distill_warmup_steps=5"]


def _batch(cfg, seed):
    batch = tensor_batch(cfg, 4, seed=seed)
    batch.update(host_indices(batch["masks"]))  # the data pipeline's host indices
    return batch


def test_compiled_step_is_one_graph_equal_to_eager():
    torch._dynamo.reset()
    cfg = tiny(*RECIPE)  # the real-page recipe's terms: every head, patch_spread, the distill ramp
    torch.manual_seed(0)
    eager = GSDistill(cfg).train()
    compiled = copy.deepcopy(eager)
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    compile_step(compiled, backend=counting)
    engine = TorchEngine.__new__(TorchEngine)  # only its forward's dynamic marking
    engine.module, engine.wrapped, engine.compiled, engine.autocast, engine.device = \
        compiled, compiled, True, False, torch.device("cpu")
    with checks(False):
        for seed in (0, 1, 2):  # three maskings, three row counts
            batch = _batch(cfg, seed)
            want, got = eager(batch), engine.forward(batch)
            assert sorted(want) == sorted(got)
            for key in want:
                torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=key)
            want["total"].backward()
            got["total"].backward()
    assert len({int(b["mask_index"].shape[0]) for b in map(lambda s: _batch(cfg, s), (0, 1, 2))}) > 1
    assert len(graphs) == 1  # the whole forward, no graph break, no recompile for new masks
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_compile_default_is_chosen_per_device():
    """``train.compile: auto`` compiles on one CUDA device for a run long enough to earn the compile
    back (measured on an H100), never on the CPU or under several GPUs; true / false are obeyed and
    anything else is refused at load time, naming the key."""
    import pytest

    from gsdistill.config import load_config
    from gsdistill.pretrain.engine_torch import COMPILE_MIN_STEPS, compile_wanted

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    auto = load_config("pretrain", None, [f"optim.steps={COMPILE_MIN_STEPS}"])
    assert auto["train"]["compile"] == "auto"
    assert compile_wanted(auto, cuda) and not compile_wanted(auto, cpu)
    assert not compile_wanted(auto, cuda, world_size=2)
    short = load_config("pretrain", None, [f"optim.steps={COMPILE_MIN_STEPS - 1}"])
    assert not compile_wanted(short, cuda)
    assert load_config("pretrain", "gpu_vit_s16", [])["optim"]["steps"] >= COMPILE_MIN_STEPS  # the GPU recipe compiles
    on, off = load_config("pretrain", None, ["train.compile=true"]), load_config("pretrain", None, ["train.compile=false"])
    assert on["train"]["compile"] is True and off["train"]["compile"] is False
    assert compile_wanted(on, cpu) and not compile_wanted(off, cuda)
    with pytest.raises(Exception, match="train.compile"):
        load_config("pretrain", None, ["train.compile=maybe"])
