"""``train.compile_scope=blocks`` (regional compilation) and ``train.compile_mode``: one traced block per
call shape reused by every block, equal to eager; stochastic depth that does not make each block a
recompile; the mode reaching ``torch.compile`` and its CPU fallback; CUDA graphs' step marks. Checked with
``aot_eager`` backends (dynamo's capture and autograd without code generation: seconds on the CPU)."""
from __future__ import annotations

import copy

import pytest
import torch

from gsdistill.losses.validation import checks
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain import step_compile
from gsdistill.pretrain.engine_torch import TorchEngine
from gsdistill.pretrain.step_compile import BufferDropPath, compile_mode, compile_scope, compile_step, vit_blocks
from test_pretrain_compile import RECIPE, _batch, _engine, float64_twins
from test_pretrain_train import tiny


def _counting(graphs, backend="aot_eager"):
    def compiler(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)
    return compiler


def test_blocks_trace_one_block_per_call_and_reuse_it_at_any_depth():
    """Depth 3 with stochastic depth 0.1 (rates 0, 0.05, 0.1: dynamo guards float attributes by value, so
    timm's DropPath made every block a recompile): the student's global and local calls and the teacher's
    two compile one block graph each, whatever the depth; the checked first step compiles nothing."""
    counts = {}
    for depth in (1, 3):
        torch._dynamo.reset()
        cfg = tiny(f"model.backbone.depth={depth}", "model.backbone.drop_path_rate=0.1")
        torch.manual_seed(0)
        model = GSDistill(cfg).train()
        graphs = []
        assert compile_step(model, backend=_counting(graphs), scope="blocks") == 2 * depth  # student + teacher
        engine = _engine(model)
        with checks(True):
            engine.forward(_batch(cfg, 0, torch.float32))["total"].backward()
        assert graphs == []
        with checks(False):
            for _ in range(2):  # one masking: a test batch is not padded, and a new masking is a new shape
                engine.forward(_batch(cfg, 1, torch.float32))["total"].backward()
        counts[depth] = len(graphs)
    assert counts == {1: 4, 3: 4}  # student global / local (grad), teacher global / local (no grad)


def test_blocks_scope_equals_eager_in_float64():
    """Regional compilation changes where the step's code comes from, never its values: losses and every
    gradient equal eager's (float64, inductor's partition without code generation), the state dict too."""
    graphs = []

    def blocks(model):  # the state dict's names are eager's (the twin is a deep copy of it)
        names = list(model.state_dict())
        compile_step(model, backend=_counting(graphs, "aot_eager_decomp_partition"), scope="blocks")
        assert list(model.state_dict()) == names

    cfg = tiny(*RECIPE, "model.backbone.depth=2")
    float64_twins(cfg, blocks, (0, 1))
    assert graphs


def test_buffer_drop_path_drops_as_timm_does():
    """Each sample's branch kept with probability 1 - rate and scaled by 1 / (1 - rate) in training, the
    identity in eval, nothing saved; blocks with one rate (timm's Identity at 0) are left as they are."""
    torch.manual_seed(0)
    drop = BufferDropPath(0.25)
    x = torch.ones(40_000, 3, 2)
    out = drop.train()(x)
    kept = out[:, 0, 0] != 0
    assert abs(kept.float().mean().item() - 0.75) < 4 * (0.75 * 0.25 / 40_000) ** 0.5
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.75))
    assert torch.equal(out[~kept], torch.zeros_like(out[~kept]))
    assert torch.equal(drop.eval()(x), x) and drop.state_dict() == {}
    model = GSDistill(tiny("model.backbone.depth=2")).train()
    assert step_compile.share_drop_paths(vit_blocks(model)) == 0  # rate 0: nothing to share


def test_a_failed_block_compile_under_auto_trains_on_eager(capsys):
    """A block's compile fails in the middle of the forward (after the patch embedding, before any loss
    or buffer update): under ``auto`` the step reruns eager, counted once, its loss equal to eager's."""
    torch._dynamo.reset()
    cfg = tiny(*RECIPE)
    calls = []

    def broken(gm, example_inputs):
        calls.append(gm)
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    reference = copy.deepcopy(model)
    compile_step(model, backend=broken, scope="blocks")
    engine = _engine(model, compile_optional=True)
    with checks(False):
        for seed in (1, 2):
            torch.manual_seed(seed)
            got = engine.forward(_batch(cfg, seed, torch.float32))
            torch.manual_seed(seed)
            torch.testing.assert_close(got["total"], reference(_batch(cfg, seed, torch.float32))["total"])
    assert len(calls) == 1 and engine.compile_failed
    assert int(model.steps_seen) == int(reference.steps_seen) == 2
    assert "compiling the step failed" in capsys.readouterr().err


def test_compile_settings_reach_torch_compile(monkeypatch, capsys, tmp_path):
    """``train.compile_mode`` and ``compile_scope`` are what the engine passes to ``torch.compile`` (the
    default: the whole step); on the CPU a CUDA-graph mode compiles without the graphs, said on stderr."""
    seen = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: seen.append((type(self).__name__, kw)))
    cpu = torch.device("cpu")
    for mode, passed in (("reduce-overhead", None), ("max-autotune", "max-autotune-no-cudagraphs"),
                         ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs"), ("default", None)):
        for scope, compiled in (("step", {"GSDistill"}), ("blocks", {"Block"})):
            seen.clear()
            cfg = tiny("train.compile=true", f"train.compile_mode={mode}", f"train.compile_scope={scope}",
                       f"train.compile_cache={tmp_path / 'cache'}")
            engine = TorchEngine(GSDistill(cfg), cfg, cpu)
            assert {name for name, _ in seen} == compiled and not engine.cudagraphs
            assert all(kw.get("mode") == passed and kw["backend"] == "inductor" for _, kw in seen), (mode, seen)
    assert "CUDA graphs need a CUDA device; compiling with mode=default on cpu" in capsys.readouterr().err
    cuda = torch.device("cuda")  # resolved without a device: nothing is allocated
    assert compile_mode(tiny("train.compile_mode=reduce-overhead"), cuda) == "reduce-overhead"
    assert compile_scope(tiny()) == "step" and compile_scope(tiny("train.compile_scope=blocks")) == "blocks"
    from gsdistill.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="train.compile_mode"):
        load_config("pretrain", None, ["train.compile_mode=fast"])


def test_cuda_graph_steps_are_marked_and_their_terms_kept(monkeypatch):
    """With CUDA graphs each compiled step marks its start (the graphs may then reuse the last step's
    output memory) and returns copies of its terms, which still carry the gradient; an eager (checked)
    step marks nothing. The marks are counted on the CPU: the graphs themselves need a GPU."""
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    cfg = tiny()
    torch.manual_seed(0)
    model = GSDistill(cfg).train()
    engine = _engine(model)
    engine.cudagraphs = True
    kept = {}
    monkeypatch.setattr(model, "forward", lambda batch, f=model.forward: kept.update(f(batch)) or kept)
    with checks(True):
        engine.forward(_batch(cfg, 0, torch.float32))
    assert marks == []  # checked: eager
    with checks(False):
        terms = engine.forward(_batch(cfg, 1, torch.float32))
    assert marks == [1]
    assert terms["total"].data_ptr() != kept["total"].data_ptr() and torch.equal(terms["total"], kept["total"])
    terms["total"].backward()
    assert any(p.grad is not None for p in model.parameters())
