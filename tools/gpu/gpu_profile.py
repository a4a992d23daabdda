"""Where a training step's device time goes: a few torch-engine steps under ``torch.profiler``, the
top kernels and their share of the device time (``tools/gpu/gpu_check.py``'s profile row).

The steps are the engine's own (``forward``, ``backward_step``, ``update_teacher``) on a batch of
random tensors of the recipe's shapes, so data loading is not in it (gpu_check's data-wait column
is). On the CPU (``gpu_check --cpu``) the same code profiles CPU operators. The events are read once
(``gsdistill.pretrain.step_profile.summarise``), not through ``key_averages``, which took minutes over
a compiled step's events on an H200 (issue 57).
"""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def profile_steps(experiment: str | None, overrides: list[str], batch: int, device: torch.device,
                  warmup: int = 2, steps: int = 3, top: int = 5) -> dict:
    """``{"steps", "device_ms_per_step", "top": [(kernel name, share of device time)]}``."""
    from gsdistill.config import load_config
    from gsdistill.models.gsdistill_model import GSDistill
    from gsdistill.pretrain.data_stream import tensor_batch, to_device
    from gsdistill.pretrain.engine_torch import TorchEngine
    from gsdistill.pretrain.step_profile import read_events, summarise

    cfg = load_config("pretrain", experiment, [*overrides, "train.precision=bf16", "train.engine=torch"])
    torch.manual_seed(0)
    model = GSDistill(cfg)
    engine = TorchEngine(model, cfg, device)
    data = to_device(tensor_batch(cfg, batch, patch_size=int(model.backbone.patch_embed.patch_size[0])), device)

    def step() -> None:
        terms = engine.forward(data)
        engine.backward_step(terms["total"], 1e-4)
        engine.update_teacher(0.996)

    for _ in range(warmup):
        step()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    summary = summarise(read_events(prof))
    # kernels on the device; operators' self time on the CPU, not the engine's own record_function ranges
    rows = summary["device"] if cuda else {k: v for k, v in summary["self_cpu"].items()
                                           if not k.startswith("gsdistill.")}
    total = sum(us for us, _ in rows.values())
    ranked = sorted(rows.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    return {"steps": steps, "device_ms_per_step": total / steps / 1e3,
            "top": [(name, us / total) for name, (us, _) in ranked]}


def profile_row(result: dict, width: int = 48) -> str:
    """One markdown paragraph: device time per step and the top kernels with their shares."""
    kernels = "; ".join(f"`{name[:width]}` {share:.1%}" for name, share in result["top"])
    return (f"Profile (torch engine, bf16, {result['steps']} steps): {result['device_ms_per_step']:.1f} ms "
            f"device time per step; top kernels: {kernels}.")
