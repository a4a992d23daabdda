"""Compile time and compiled step of one tree (issue 57 item 2; docs/benchmarks.md, "Compile in seconds"):
one measurement of the tree on PYTHONPATH, so the same command runs in an old checkout and in this one,
alternating, each in a fresh process:

    PYTHONPATH=TREE python tools/bench/bench_compile.py MODEL SCOPE PAIRS SHARD_DIR CACHE_DIR

MODEL: ``tiny`` (tools/bench/bench_fixed_shapes.py's ViT: depth 1, 32 / 16 px views, batch 4, K = 64), ``deep``
(the same at depth 12, gpu_vit_s16's depth) or ``demo`` (the CPU demo recipe: ViT-Tiny, 4 blocks, batch 16).
SCOPE: ``step`` or ``blocks`` (``train.compile_scope``; a tree without that key compiles the step).
CACHE_DIR: inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``): a fresh folder for a cold compile, the
folder of an earlier run of the same command for a warm one.

Every step is the loop's (forward, backward, clip, AdamW, EMA, one read), one torch thread, on the shard
stream's padded batches made before the timed steps; the first step is checked and eager, as in the loop.
Compile seconds = the compiling steps' time less the median compiled step's. Then PAIRS steps alternate
compiled and eager (``set_stance("force_eager")``, the same module) on the same batches: the per-step
gain, paired within one process. CPU seconds count the C++ compiler's processes when inductor runs them
itself (``TORCHINDUCTOR_COMPILE_THREADS=1``), so a compile's cost holds beside other load. Prints one JSON line.
"""
import json
import os
import statistics
import sys
import time

model_name, scope, pairs, shard_dir, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(cache)  # before torch reads it

import torch  # noqa: E402

torch.set_num_threads(1)
import gsdistill  # noqa: E402
from gsdistill.config import load_config  # noqa: E402
from gsdistill.losses.validation import checks  # noqa: E402
from gsdistill.models.gsdistill_model import GSDistill  # noqa: E402
from gsdistill.pretrain.data_stream import ShardBatches, to_device  # noqa: E402
from gsdistill.pretrain.engine_torch import TorchEngine  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

TINY = ["model.backbone.img_size=32", "views.global_size=32", "views.local_size=16", "model.dino_out_dim=64",
        "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32", "optim.batch_size=4"]
MODELS = {"tiny": TINY + ["model.backbone.depth=1"], "deep": TINY + ["model.backbone.depth=12"], "demo": []}
over = MODELS[model_name] + ["train.compile=true", "threads=1", "train.progress=false"]
has_scope = "compile_scope" in load_config("pretrain", None, [])["train"]
if has_scope:
    over.append(f"train.compile_scope={scope}")
elif scope != "step":
    sys.exit(f"{scope}: this tree compiles the whole step only")
cfg = load_config("pretrain", None, over)
torch.manual_seed(0)
cpu = torch.device("cpu")
engine = TorchEngine(GSDistill(cfg), cfg, cpu)
stream = ShardBatches(shard_dir, cfg, 0, 1, int(cfg["optim"]["batch_size"]), 16)
warmup = 6
batches = [next(stream) for _ in range(warmup + pairs)]


def cpu_seconds() -> float:
    """This process's CPU time and its finished children's (the C++ compiler's runs: with
    TORCHINDUCTOR_COMPILE_THREADS=1 inductor runs them from this process)."""
    children = os.times()  # in clock ticks (10 ms): fine for a compile, not for a step
    return time.process_time() + children.children_user + children.children_system


def one_step(batch, check=False, eager=False):
    t, c = time.perf_counter(), cpu_seconds()
    stance = torch.compiler.set_stance("force_eager") if eager else torch.compiler.set_stance("default")
    with checks(check), stance:
        terms = engine.forward(to_device(batch, cpu))
        norm = engine.backward_step(terms["total"], 1e-4)
        engine.update_teacher(0.99)
        float(norm)
    return time.perf_counter() - t, cpu_seconds() - c


times, graphs = [], []
for i, b in enumerate(batches[:warmup]):
    times.append(one_step(b, check=i == 0))
    graphs.append(counters["stats"]["unique_graphs"])
compiled, eager = [], []
for i, b in enumerate(batches[warmup:]):  # alternating, the first of each pair swapped every other pair
    order = (False, True) if i % 2 == 0 else (True, False)
    for e in order:
        (eager if e else compiled).append(one_step(b, eager=e))
warm, warm_cpu = statistics.median(t for t, _ in compiled), statistics.median(c for _, c in compiled)
compiling = [step for step, g0, g1 in zip(times[1:], graphs, graphs[1:]) if g1 > g0]
ratios = sorted(c[1] / e[1] for c, e in zip(compiled, eager))
q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
print(json.dumps({
    "tree": os.path.dirname(os.path.dirname(gsdistill.__file__)), "model": model_name,
    "scope": scope if has_scope else "step (no key)", "graphs": counters["stats"]["unique_graphs"],
    "compile_steps": [i + 2 for i, (a, c) in enumerate(zip(graphs, graphs[1:])) if c > a],
    "compile_s": round(sum(t - warm for t, _ in compiling), 1),
    "compile_cpu_s": round(sum(c - warm_cpu for _, c in compiling), 1),
    "compile_threads": int(os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", 0)) or None,
    "compiled_cpu_s": round(statistics.median(c for _, c in compiled), 4),
    "eager_cpu_s": round(statistics.median(c for _, c in eager), 4),
    "compiled_over_eager_cpu": [round(q[0], 3), round(statistics.median(ratios), 3), round(q[2], 3)],
    "first_steps_s": [round(t, 1) for t, _ in times]}))
if os.environ.get("BENCH_COMPILE_TIMES"):  # dynamo / AOTAutograd / inductor seconds, on stderr
    print(torch._dynamo.utils.compile_times(repr="str", aggregate=True), file=sys.stderr)
