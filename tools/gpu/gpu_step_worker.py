"""One variant of ``tools/gpu/gpu_step.py``: the torch engine of the tree named first on the command line,
answering ``step``, ``loop``, ``flops``, ``profile``, ``memory`` and ``graphs`` on stdin, one JSON line each.

    python tools/gpu/gpu_step_worker.py TREE EXPERIMENT OVERRIDES_JSON BATCH_FILES_JSON DEVICE BACKEND
"""
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode
from gsdistill.config import load_config
from gsdistill.models.gsdistill_model import GSDistill
from gsdistill.losses import validation
from gsdistill.pretrain import engine_torch
from gsdistill.pretrain.data_stream import to_device
validation.set_checks(False)  # as the training loop does after its first step
cfg = load_config("pretrain", sys.argv[2] or None, json.loads(sys.argv[3]))
dev, backend = torch.device(sys.argv[5]), sys.argv[6]
if hasattr(engine_torch, "compile_step"):  # the tool's backend (aot_eager in its test), every other setting the tree's
    real_compile = engine_torch.compile_step
    engine_torch.compile_step = lambda model, *a, **kw: real_compile(model, *a, **{**kw, "backend": backend})
torch.manual_seed(0)
engine = engine_torch.TorchEngine(GSDistill(cfg), cfg, dev)
batches = [to_device(torch.load(f, weights_only=True), dev) for f in json.loads(sys.argv[4])]
pages = len(batches[0]["sem_emb"])
done = [0]
def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
guard = bool(getattr(engine, "guards_on_device", False))
def step():  # the loop's step: the old loop read the terms before backward (its non-finite guard)
    batch = batches[done[0] % len(batches)]
    done[0] += 1
    terms = engine.forward(batch)
    read = [v.detach().float().reshape(()) for v in terms.values() if torch.is_tensor(v) and v.numel() == 1]
    if not guard:
        torch.stack(read).tolist()
    norm = engine.backward_step(terms["total"], 1e-4)
    engine.update_teacher(0.996)
    torch.stack([*read, norm.float()] if guard else [norm.float()]).tolist()  # one read after the update
def timed():
    sync(); t = time.perf_counter(); step(); sync()
    return time.perf_counter() - t
def flops():
    with FlopCounterMode(display=False) as counter:
        engine.forward(batches[0])["total"].backward()
    engine.optimizer.zero_grad(set_to_none=True)
    return counter.get_total_flops() / pages
def top(n=8, steps=3):
    cuda = dev.type == "cuda"
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        sync()
    try:  # the events read once (a compiled step's key_averages ran for minutes on an H200)
        from gsdistill.pretrain.step_profile import read_events, summarise
        summary = summarise(read_events(prof))
        rows = summary["device"] if cuda else summary["self_cpu"]
    except ImportError:  # an old tree
        rows = {e.key: [float(getattr(e, "self_device_time_total", 0.0) if cuda else e.self_cpu_time_total), e.count]
                for e in prof.key_averages()}
    rows = {k: v for k, v in rows.items() if v[0] > 0 and not k.startswith("gsdistill.")}
    total = sum(us for us, _ in rows.values())
    ranked = sorted(rows.items(), key=lambda kv: kv[1][0], reverse=True)[:n]
    return {"device_ms_per_step": total / steps / 1e3, "kernels_per_step": sum(c for _, c in rows.values()) / steps,
            "top": [[k[:90], us / total] for k, (us, _) in ranked]}
trainer = []
def loop_step():  # the training loop's own step (Trainer._one_step) on the same batches, no DataLoader
    if not trainer:
        import tempfile
        from gsdistill.pretrain.data_stream import FixedBatches
        from gsdistill.pretrain.loop import Trainer
        host = []
        for f in json.loads(sys.argv[4]):
            b = torch.load(f, weights_only=True)
            for k in ("global_crops", "local_crops"):  # uint8 pixels, as the views pipeline sends them
                b[k] = (b[k] * 40 + 128).clamp(0, 255).to(torch.uint8)
            if dev.type == "cuda":
                b = {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in b.items()}
            host.append(b)
        trainer.append(Trainer(cfg, tempfile.mkdtemp(), engine, FixedBatches(host), device=dev))
    sync(); t = time.perf_counter(); trainer[0]._one_step(); sync()
    return time.perf_counter() - t
def memory():
    return torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")
import gsdistill
print(json.dumps({"ready": gsdistill.__file__}), flush=True)
for line in sys.stdin:
    what = line.strip()
    answer = {"step": lambda: {"s": timed()}, "loop": lambda: {"s": loop_step()}, "flops": lambda: {"flops": flops()}, "profile": top,
              "memory": lambda: {"gib": memory()},
              "graphs": lambda: {"graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"]}}[what]()
    print(json.dumps(answer), flush=True)
