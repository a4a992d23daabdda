"""Both engines under fp32 and bf16 on the CPU, in one process: the bf16 DeepSpeed forward runs
(its batch meets bf16 weights), and the EMA teacher after N steps equals an fp32 EMA, computed here
in float64, of the student's fp32 weights after each step, under every engine and precision."""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from gsdistill.config import load_config
from gsdistill.pretrain.data_stream import tensor_batch, to_device
from test_pretrain_distributed import TINY

STEPS, MOMENTUM, LR = 3, 0.996, 1e-2
RUNS = [("torch", "fp32"), ("torch", "bf16"), ("deepspeed", "fp32"), ("deepspeed", "bf16"),
        ("deepspeed", "bf16/ibot_head")]  # + model.ibot_separate_head: its teacher copy is EMA'd under ZeRO-3 too


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(engine_name: str, precision: str) -> dict:
    """N steps; the student's fp32 weights after each, the teacher's at the start and the end."""
    from gsdistill.models.gsdistill_model import GSDistill
    from gsdistill.pretrain.run import build_engine

    precision, *extra = precision.split("/")
    extra = ["model.ibot_separate_head=true"] if extra == ["ibot_head"] else []
    cfg = load_config("pretrain", None, TINY + [f"train.engine={engine_name}", f"train.precision={precision}", *extra])
    torch.manual_seed(0)
    model = GSDistill(cfg)
    names = [n for n, _ in model.named_parameters() if n.startswith("teacher.")]
    start = {n: p.detach().double().clone() for n, p in model.named_parameters() if n.startswith("teacher.")}
    engine = build_engine(cfg, model, torch.device("cpu"), 1, 4)
    students, dtypes = [], {}
    for step in range(STEPS):
        terms = engine.forward(to_device(tensor_batch(cfg, 4, seed=step), torch.device("cpu")))
        dtypes = {k: str(v.dtype) for k, v in terms.items()}
        engine.backward_step(terms["total"], LR)
        state = engine.model_state()
        students.append({n: state[n[len("teacher."):]].double() for n in names})
        engine.update_teacher(MOMENTUM)
    end = engine.model_state()
    return {"start": start, "students": students, "teacher": {n: end[n] for n in names}, "dtypes": dtypes,
            "forward_teacher": _forward_teacher(model, names),
            "module_dtype": str(next(p for n, p in model.named_parameters() if n.startswith("teacher.")).dtype)}


def _forward_teacher(model, names: list[str]) -> dict:
    """The teacher weights the next forward reads (ZeRO-3: gathered from the ranks' slices)."""
    params = dict(model.named_parameters())
    zero3 = hasattr(params[names[0]], "ds_id")
    if zero3:
        import deepspeed
        with deepspeed.zero.GatheredParameters([params[n] for n in names]):
            return {n: params[n].detach().clone() for n in names}
    return {n: params[n].detach().clone() for n in names}


def _worker(_rank: int, port: int, out: str) -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from gsdistill.pretrain.distributed import join_from_env
    join_from_env(torch.device("cpu"), always=True)  # DeepSpeed wants a process group, even alone
    torch.save({f"{e}/{p}": _run(e, p) for e, p in RUNS}, out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    pytest.importorskip("deepspeed")
    out = tmp_path_factory.mktemp("engines") / "runs.pt"
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=1, join=True)
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("engine,precision", RUNS)
def test_teacher_equals_fp32_ema_of_the_student(runs, engine, precision):
    run = runs[f"{engine}/{precision}"]
    reference = dict(run["start"])
    for student in run["students"]:
        reference = {n: MOMENTUM * reference[n] + (1 - MOMENTUM) * student[n] for n in reference}
    moved = max(float((reference[n] - run["start"][n]).abs().max()) for n in reference)
    diff = max(float((run["teacher"][n].double() - reference[n]).abs().max()) for n in reference)
    print(f"{engine}/{precision}: teacher max |diff| vs fp32 EMA {diff:.3g} (the EMA moved it by up to {moved:.3g})")
    assert moved > 1e-5  # the reference moved: the test can see a teacher that does not
    assert diff < 1e-6, (engine, precision, diff, moved)
    assert all(t.dtype == torch.float32 for t in run["teacher"].values())
    assert any(n.startswith("teacher.ibot_head.") for n in reference) == precision.endswith("/ibot_head")
    for n, weight in run["forward_teacher"].items():  # the forward reads the fp32 master, rounded
        assert torch.equal(weight, run["teacher"][n].to(weight.dtype)), n


def test_deepspeed_bf16_runs_bf16_weights_with_the_batch_cast(runs):
    run = runs["deepspeed/bf16"]
    assert run["module_dtype"] == "torch.bfloat16"  # DeepSpeed's bf16 mode: the forward's weights
    assert run["dtypes"]["total"] == "torch.float32"  # the loss as autocast leaves it, like the torch engine
