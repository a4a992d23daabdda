"""Fixed shapes, one compile (issue 57; docs/benchmarks.md, "Fixed shapes: one compile"): one measurement of
the tree on PYTHONPATH, so the same command runs in an old checkout (``git worktree add``) and in this one,
alternating:

    PYTHONPATH=TREE python tools/bench/bench_fixed_shapes.py compile 30 SHARD_DIR   # tiny ViT, inductor: graphs, compile s
    PYTHONPATH=TREE python tools/bench/bench_fixed_shapes.py eager 40 SHARD_DIR     # CPU demo recipe, eager: step s
    ... saved|compile_saved STEPS SHARD_DIR BATCHES.pt   # the same saved batches in both trees

SHARD_DIR: embedded shards (e.g. ``gsdistill tuples build --from synthetic 64`` then ``tuples embed``).
Prints one JSON line: graphs compiled, the steps that compiled, compile seconds (the compiling steps'
time less the warm step's), median wall and CPU step seconds, the batches' text widths.
"""
import json
import os
import statistics
import sys
import time

import torch
torch.set_num_threads(1)
import gsdistill
import gsdistill.pretrain.data_stream
from gsdistill.config import load_config
from gsdistill.losses.validation import checks
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.pretrain.data_stream import ShardBatches, to_device
from gsdistill.pretrain.engine_torch import TorchEngine
from torch._dynamo.utils import counters

mode, steps = sys.argv[1], int(sys.argv[2])
TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "optim.batch_size=4", "train.compile=true"]
over = (TINY if mode.startswith("compile") else ["train.compile=false"]) + ["threads=1", "train.progress=false"]
cfg = load_config("pretrain", None, over)
local = int(cfg["optim"]["batch_size"])
torch.manual_seed(0)
cpu = torch.device("cpu")
engine = TorchEngine(GSDistill(cfg), cfg, cpu)
if mode in ("saved", "compile_saved"):  # the new stream's batches: padded for the new tree, cut to their own counts for the old one
    saved = torch.load(sys.argv[4], weights_only=False)
    batches = saved["padded" if hasattr(gsdistill.pretrain.data_stream, "pad_batch") else "unpadded"][:steps]
else:
    stream = ShardBatches(sys.argv[3], cfg, 0, 1, local, 16)
    batches = [next(stream) for _ in range(steps)]  # made first: the step times hold no data loading
widths = sorted({int(b["sem_valid"].sum(1).max()) for b in batches})
times, cpu_times, graphs = [], [], []
for i, b in enumerate(batches):
    t, c = time.perf_counter(), time.process_time()
    with checks(i == 0):
        terms = engine.forward(to_device(b, cpu))
        norm = engine.backward_step(terms["total"], 1e-4)
        engine.update_teacher(0.99)
        float(norm)
    times.append(time.perf_counter() - t)
    cpu_times.append(time.process_time() - c)
    graphs.append(counters["stats"]["unique_graphs"])
warm = statistics.median(times[-10:])
compile_s = sum(t - warm for t, g0, g1 in zip(times[1:], graphs, graphs[1:]) if g1 > g0)
print(json.dumps({"tree": os.path.dirname(os.path.dirname(gsdistill.__file__)), "mode": mode,
                  "graphs": graphs[-1], "compile_steps": [i + 2 for i, (a, c) in enumerate(zip(graphs, graphs[1:])) if c > a],
                  "compile_s": round(compile_s, 1), "median_s": round(statistics.median(times[3:]), 4),
                  "cpu_median_s": round(statistics.median(cpu_times[3:]), 4), "q25_s": round(statistics.quantiles(times[3:], n=4)[0], 4),
                  "text_rows_unpadded": widths, "text_rows_fed": int(batches[0]["sem_emb"].shape[1])}))
