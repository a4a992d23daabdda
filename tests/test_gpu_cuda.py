"""What only a GPU can show (marked ``cuda``, skipped without one; ``tools/gpu_check.sh`` runs them
with ``pytest -m cuda``; the engine tests of ``tests/test_gpu_engines.py`` run on the GPU too):
where each DeepSpeed config keeps the weights, the fp32 masters and the Adam moments, the EMA
teacher included; that batches arrive in pinned memory; and that every loss term stays fp32 under
CUDA's bf16 autocast, which keeps other ops in fp32 than the CPU's."""
from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from gsdistill.config import load_config
from gsdistill.pretrain.data_stream import tensor_batch, to_device
from test_gpu_engines import _free_port
from test_pretrain_distributed import TINY

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda", 0)


def _placement(_rank: int, port: int, config: str, out: str) -> None:
    """Devices of the largest teacher / student weights (pinning too) and of the optimizer's fp32
    masters and Adam moments after one step: the EMA runs where those weights are."""
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from gsdistill.models.gsdistill_model import GSDistill
    from gsdistill.pretrain.distributed import join_from_env
    from gsdistill.pretrain.run import build_engine

    torch.cuda.set_device(CUDA)
    join_from_env(CUDA, always=True)
    cfg = load_config("pretrain", None, TINY + ["train.engine=deepspeed", "train.precision=bf16",
                                                f"train.deepspeed_config=configs/deepspeed/{config}",
                                                "model.dino_out_dim=4096", "model.dino_bottleneck_dim=32"])
    torch.manual_seed(0)
    model = GSDistill(cfg)
    engine = build_engine(cfg, model, CUDA, 1, 4)
    terms = engine.forward(to_device(tensor_batch(cfg, 4), CUDA))
    engine.backward_step(terms["total"], 1e-3)
    engine.update_teacher(0.996)

    def where(t: torch.Tensor) -> str:
        return f"{t.device.type}{'/pinned' if t.device.type == 'cpu' and t.is_pinned() else ''}"

    # the prototypes, 4096 x 32: above zero3_param_offload's persistence threshold (1e5), so offloaded there
    t, s = max(model.teacher_pairs(), key=lambda pair: getattr(pair[0], "ds_numel", pair[0].numel()))
    zero3 = hasattr(t, "ds_tensor")
    zero = engine.optimizer  # ZeRO's flat fp32 partitions: stage 3's, else stage 1/2's
    masters = getattr(zero, "fp32_partitioned_groups_flat", None) or zero.single_partition_of_fp32_groups
    moments = [v for state in engine.optimizer.state.values() for v in state.values()
               if torch.is_tensor(v) and v.numel() > 1]
    torch.save({"teacher": where(t.ds_tensor if zero3 else t), "student": where(s.ds_tensor if zero3 else s),
                "dtype": str(t.dtype), "masters": sorted({m.device.type for m in masters}),
                "moments": sorted({m.device.type for m in moments})}, out)
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("config,weights,optimizer", [
    ("zero2_optimizer_offload.json", "cuda", "cpu"),  # the default: only the optimizer on the CPU
    ("zero3_optimizer_offload.json", "cuda", "cpu"),  # the paper's ZeRO-3, optimizer on the CPU
    ("zero3_param_offload.json", "cpu/pinned", "cpu"),
    ("zero2.json", "cuda", "cuda"),
])
def test_each_deepspeed_config_keeps_its_state_where_it_says(tmp_path, config, weights, optimizer):
    pytest.importorskip("deepspeed")
    out = tmp_path / "placement.pt"
    mp.spawn(_placement, args=(_free_port(), config, str(out)), nprocs=1, join=True)
    found = torch.load(out)
    assert (found["teacher"], found["student"], found["dtype"]) == (weights, weights, "torch.float32"), found
    assert found["masters"] == [optimizer] and found["moments"] == [optimizer], found


def test_batches_arrive_in_pinned_memory(tmp_path):
    from gsdistill.pretrain.data_stream import ShardBatches
    from gsdistill.pretrain.run import prepare_synthetic

    cfg = load_config("pretrain", None, TINY + ["data.synthetic_pages=8", "data.num_workers=2", "data.page_width=256",
                                                "data.page_height=320"])
    shards = prepare_synthetic(cfg, tmp_path / "data")
    batch = next(iter(ShardBatches(str(shards), cfg, 0, 1, 4, 16, pin_memory=True)))
    assert batch["global_crops"].is_pinned() and batch["sem_emb"].is_pinned()


def test_every_loss_term_is_float32_under_cuda_bf16_autocast():
    from gsdistill.models.gsdistill_model import GSDistill

    cfg = load_config("pretrain", None, TINY)
    batch = to_device(tensor_batch(cfg, 4), CUDA)

    def terms(autocast: bool) -> dict:
        # a fresh model each time: a second call of one model meets the first call's embeddings in
        # its negatives queue (objective.queue_size), which moved sem and geom by 0.4 on the H100
        torch.manual_seed(0)
        model = GSDistill(cfg).to(CUDA).train()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            return model(batch)

    ref, out = terms(False), terms(True)
    assert set(out) == set(ref) >= {"sem", "geom", "distill", "ibot", "koleo", "total"}
    for key, value in out.items():
        assert value.dtype == torch.float32 and torch.isfinite(value).all(), key
        # the backbone runs in bf16: 3e-2 as on the CPU (tests/test_gpu_numerics.py)
        torch.testing.assert_close(value, ref[key], rtol=3e-2, atol=3e-2, msg=lambda m, key=key: f"{key}: {m}")
