"""Held-out check for any checkpoint path (issue 12 item 9) and damaged exported artefacts (item 7)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from gsdistill.tuples.errors import DataError
from gsdistill.tuples.store.writer import write_shards
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.tuples.store.text_cache import CachedEmbeddings
from gsdistill.errors import CorruptFileError, MissingFileError
from gsdistill.models.backbone import create_backbone, load_backbone, save_backbone
from gsdistill.eval import cli as eval_cli
from gsdistill.pretrain import run_folder


def _run(tmp_path: Path, shards: str | None = None) -> Path:
    """A pretraining run folder as the trainer leaves it (config, checkpoints/step-N, synthetic data/)."""
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step-000004"
    ckpt.mkdir(parents=True)
    cfg = {"data": {"shards": shards}, "views": {"global_size": 64}}
    for folder in (run, ckpt):
        (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "checkpoints" / "latest").write_text("step-000004\n")
    return run


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pages")
    write_shards(generate_pages(4, seed=0, width=256, height=256), out, progress=False)
    return out


@pytest.mark.parametrize("model", [".", "checkpoints", "checkpoints/step-000004"])
def test_held_out_check_holds_for_every_checkpoint_path(tmp_path, pages, model, capsys):
    run = _run(tmp_path)
    (run / "data").symlink_to(pages, target_is_directory=True)  # the run pretrained on these very pages
    code = eval_cli.main(["retrieval", "--model", str(run / model), "--pages", str(pages), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "also in the pretraining data" in err
    assert f"the synthetic pretraining pages of run {run}" in err


def test_relative_data_shards_resolve_against_the_run(tmp_path, pages, monkeypatch):
    run = _run(tmp_path, shards="shards")
    (run / "shards").symlink_to(pages, target_is_directory=True)
    monkeypatch.chdir(tmp_path)  # the working directory has no ./shards
    model = run / "checkpoints" / "step-000004"
    path, origin = run_folder.pretrain_source(model, run_folder.run_config(model))
    assert path == run / "shards" and origin == f"data.shards='shards' of {model / 'config.yaml'}, relative to the run"
    gone = _run(tmp_path / "other", shards="missing")
    with pytest.raises(MissingFileError, match=r"data.shards='missing' of .*config.yaml: not found.*--allow-overlap"):
        run_folder.pretrain_source(gone, run_folder.run_config(gone))


def test_truncated_backbone_names_the_file(tmp_path):
    cfg = {"name": "vit_tiny_patch16_224", "img_size": 32, "depth": 1}
    out = save_backbone(create_backbone(cfg), cfg, tmp_path / "bb")
    weights = out / "backbone.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    with pytest.raises(CorruptFileError, match=f"{weights}: unreadable safetensors file"):
        load_backbone(out)


def test_truncated_embeddings_npz_names_the_file(tmp_path):
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes(b"x" * 10)
    cache = tmp_path / "cache"
    cache.mkdir()
    npz = cache / "shard-000000.npz"
    np.savez(npz, **{"p0.sem": np.zeros((2, 4), np.float32)})
    npz.write_bytes(npz.read_bytes()[:-30])  # the zip index at the end is cut off
    reader = CachedEmbeddings.__new__(CachedEmbeddings)
    reader.dir, reader.meta = cache, {"shards": {shard.name: 10}}
    with pytest.raises(DataError, match=f"{npz}: unreadable embeddings file, truncated or corrupt"):
        reader.for_shard(shard, digest="any")
