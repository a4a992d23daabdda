"""``run_pretraining(cfg)``: data -> GSDistill model -> engine -> loop -> checkpoints -> backbone export.

Data come from ``cfg.data.shards`` (a shard dir with cached text embeddings); when it is empty,
synthetic pages are generated, written as shards and embedded into ``RUN_DIR/data`` first (the
embedded default: no download, runs anywhere).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist

from gsdistill.config import save_config
from gsdistill.models.backbone import create_backbone, save_backbone
from gsdistill.train import checkpoint
from gsdistill.train.distributed import setup
from gsdistill.train.loop import Trainer


def _broadcast_str(value: str) -> str:
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def resolve_run_dir(cfg, run_dir: Path | None) -> Path:
    """``run_dir`` if given; the resumed run's folder on resume; else a new timestamped folder."""
    if run_dir is not None:
        return Path(run_dir)
    if cfg["train"]["resume"]:
        ckpt = checkpoint.resolve_checkpoint(cfg["train"]["resume"])
        return ckpt.parent.parent
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(_broadcast_str(str(Path(cfg["train"]["run_dir"]) / stamp)))


def prepare_synthetic(cfg, out_dir: Path) -> Path:
    """Generate, shard and embed ``data.synthetic_pages`` synthetic pages (once per run dir)."""
    from gsdistill.data.shards import write_shards
    from gsdistill.data.synthetic import generate_pages

    d = cfg["data"]
    if not (out_dir / "manifest.json").is_file():
        pages = generate_pages(int(d["synthetic_pages"]), seed=int(d["synthetic_seed"]),
                               width=int(d["page_width"]), height=int(d["page_height"]))
        write_shards(pages, out_dir)
    return embed_cached(cfg, out_dir)


def embed_cached(cfg, shard_dir: Path) -> Path:
    """Shard dir with the frozen text encoder's embeddings of every span and box descriptor."""
    from gsdistill.data.text_cache import embed_shards

    if not (Path(shard_dir) / "manifest.json").is_file():
        raise FileNotFoundError(f"data.shards={shard_dir}: no manifest.json; build shards with 'gsdistill tuples'")
    return Path(embed_shards(shard_dir, encoder=str(cfg["model"]["text_encoder"]),
                             batch_size=int(cfg["data"]["embed_batch_size"])))


def export_backbone(model_state: dict[str, torch.Tensor], cfg, out_dir: Path, source: str = "") -> Path:
    """Write the student backbone of a GSDistill state dict in the ``save_backbone`` format."""
    bcfg = dict(cfg["model"]["backbone"])
    backbone = create_backbone(bcfg)
    state = {k[len("backbone."):]: v for k, v in model_state.items() if k.startswith("backbone.")}
    checkpoint.load_model_state(backbone, state, Path(source or "model state"))
    return save_backbone(backbone, bcfg, out_dir, extra={"source": source, "trained_with": "gsdistill"})


def _data_stream(cfg, rank: int, world: int, local_batch: int, patch_size: int, run_dir: Path):
    from gsdistill.train.data_stream import ShardBatches

    shards = ""
    if rank == 0:  # the text cache is reused when it matches the encoder, (re)built otherwise
        given = cfg["data"]["shards"]
        shards = str(prepare_synthetic(cfg, run_dir / "data") if not given else embed_cached(cfg, Path(given)))
    shards = _broadcast_str(shards)  # also makes the other ranks wait for rank 0's data
    return ShardBatches(str(shards), cfg, rank, world, local_batch, patch_size)


def build_engine(cfg, model, device, world: int, local_batch: int):
    engine_name = cfg["train"]["engine"]
    if engine_name == "torch":
        from gsdistill.train.engine_torch import TorchEngine
        return TorchEngine(model, cfg, device, world)
    if engine_name == "deepspeed":
        from gsdistill.config import configs_dir
        from gsdistill.train.engine_deepspeed import DeepSpeedEngine
        path = Path(cfg["train"]["deepspeed_config"])
        if not path.is_absolute() and not path.is_file():
            path = configs_dir().parent / path
        return DeepSpeedEngine(model.to(device), cfg, device, world, local_batch, path)
    raise ValueError(f"train.engine must be 'torch' or 'deepspeed', got {engine_name!r}")


def run_pretraining(cfg, run_dir: Path | None = None, batches=None) -> Path:
    """Pretrain and return the run dir (config.yaml, metrics.csv, checkpoints/, backbone/, plots/).

    ``batches``: optional callable ``(rank, world) -> stream`` replacing the shard stream (tests, benches).
    """
    from gsdistill.models.gsdistill_model import GSDistill

    rank, world, device = setup(str(cfg["train"]["engine"]), str(cfg["train"]["device"]))
    global_batch = int(cfg["optim"]["batch_size"])
    if global_batch % world:
        raise ValueError(f"optim.batch_size={global_batch} does not split over {world} processes")
    run_dir = resolve_run_dir(cfg, run_dir)
    if rank == 0:
        save_config(cfg, run_dir)
    torch.manual_seed(int(cfg["train"]["seed"]))  # identical initial weights on every rank
    model = GSDistill(cfg)
    patch = int(model.backbone.patch_embed.patch_size[0])
    stream = (batches(rank, world) if batches is not None
              else _data_stream(cfg, rank, world, global_batch // world, patch, run_dir))
    engine = build_engine(cfg, model, device, world, global_batch // world)
    trainer = Trainer(cfg, run_dir, engine, stream, rank, world, device)
    if cfg["train"]["resume"]:
        trainer.resume(cfg["train"]["resume"])
    trainer.fit()
    state = engine.model_state()
    if rank == 0:
        export_backbone(state, cfg, run_dir / "backbone", source=str(trainer.last_checkpoint or run_dir))
    return run_dir
