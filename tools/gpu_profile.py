"""Where a training step's device time goes: a few torch-engine steps under ``torch.profiler``, the
top kernels and their share of the device time (``tools/gpu_check.py``'s profile row).

The steps are the engine's own (``forward``, ``backward_step``, ``update_teacher``) on a batch of
random tensors of the recipe's shapes, so data loading is not in it (gpu_check's data-wait column
is). On the CPU (``gpu_check --cpu``) the same code profiles CPU operators.
"""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def _self_time(event, cuda: bool) -> float:
    """Self time in µs: on the device (the training loop's profiler's reading), else on the CPU."""
    from gsdistill.pretrain.step_profile import self_device_us
    return self_device_us(event) if cuda else float(event.self_cpu_time_total)


def profile_steps(experiment: str | None, overrides: list[str], batch: int, device: torch.device,
                  warmup: int = 2, steps: int = 3, top: int = 5) -> dict:
    """``{"steps", "device_ms_per_step", "top": [(kernel name, share of device time)]}``."""
    from gsdistill.config import load_config
    from gsdistill.models.gsdistill_model import GSDistill
    from gsdistill.pretrain.data_stream import tensor_batch, to_device
    from gsdistill.pretrain.engine_torch import TorchEngine

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
    # kernels and operators, not the engine's own record_function ranges (CPU time on the CPU)
    events = [e for e in prof.key_averages() if _self_time(e, cuda) > 0 and not e.key.startswith("gsdistill.")]
    total = sum(_self_time(e, cuda) for e in events)
    ranked = sorted(events, key=lambda e: _self_time(e, cuda), reverse=True)[:top]
    return {"steps": steps, "device_ms_per_step": total / steps / 1e3,
            "top": [(e.key, _self_time(e, cuda) / total) for e in ranked]}


def profile_row(result: dict, width: int = 48) -> str:
    """One markdown paragraph: device time per step and the top kernels with their shares."""
    kernels = "; ".join(f"`{name[:width]}` {share:.1%}" for name, share in result["top"])
    return (f"Profile (torch engine, bf16, {result['steps']} steps): {result['device_ms_per_step']:.1f} ms "
            f"device time per step; top kernels: {kernels}.")
