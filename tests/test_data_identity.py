"""Issue 63 item 4: what a pretraining resume compares covers the shards' contents, not only
``manifest.json``. The build records each shard's size and sha256 in the manifest; a page edited inside
a shard (manifest unchanged) refuses the resume in one line saying the data changed, before the text
cache is touched; a shard only touched (same bytes) resumes; a run started before shard digests
existed says so once, in one line, and continues."""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

from gsdistill.config import load_config
from gsdistill.errors import InputError
from gsdistill.pretrain import checkpoint
from gsdistill.pretrain.metrics_log import read_metrics
from gsdistill.pretrain.run import prepare_synthetic, resume_config, run_pretraining
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.tuples.store.writer import write_shards

TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "optim.batch_size=4", "optim.steps=4", "optim.warmup_steps=1", "train.log_every=1",
        "train.progress=false", "train.tensorboard=false", "train.plots=false", "threads=1",
        "data.synthetic_pages=8", "data.page_width=256", "data.page_height=320", "data.shuffle_buffer=0"]


def tiny(*extra):
    return load_config("pretrain", None, TINY + list(extra))


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".gsdistill.lock"}


def edit_first_page_text(shard) -> None:
    """One page's span text changed inside the tar, every other member and the manifest as they were."""
    with tarfile.open(shard) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    name, data = next((n, d) for n, d in members if n.endswith(".json"))
    page = json.loads(data)
    page["spans"][0]["text"] = "EDITED " + page["spans"][0]["text"]
    members = [(n, json.dumps(page).encode() if n == name else d) for n, d in members]
    with tarfile.open(shard, "w") as tar:
        for n, d in members:
            info = tarfile.TarInfo(n)
            info.size = len(d)
            tar.addfile(info, io.BytesIO(d))


def test_the_manifest_records_every_shards_sha256(tmp_path):
    prepare_synthetic(tiny(), tmp_path / "built")  # gsdistill tuples build's writer
    write_shards(generate_pages(5, seed=1, width=200, height=240), tmp_path / "written", pages_per_shard=2,
                 progress=False)
    for folder in (tmp_path / "built", tmp_path / "written"):
        shards = json.loads((folder / "manifest.json").read_text())["shards"]
        assert shards and all(s["sha256"] == sha256(folder / s["name"]) for s in shards)
        assert all(s["bytes"] == (folder / s["name"]).stat().st_size for s in shards)


def test_a_page_edited_inside_a_shard_refuses_the_resume_and_a_touched_shard_resumes(tmp_path):
    shards = tmp_path / "shards"
    prepare_synthetic(tiny(), shards)
    run = run_pretraining(tiny(f"data.shards={shards}", "train.stop_after=1"), tmp_path / "run")
    shard = sorted(shards.glob("shard-*.tar"))[0]
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))  # same bytes, newer time
    run_pretraining(resume_config(None, [f"train.resume={run}", "train.stop_after=2"])[0])
    assert [int(r["step"]) for r in read_metrics(run / "metrics.csv")] == [1, 2]

    edit_first_page_text(shard)
    before_run, before_data = snapshot(run), snapshot(shards)
    with pytest.raises(InputError) as e:
        run_pretraining(resume_config(None, [f"train.resume={run}"])[0])
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{shard}: the data changed")
    assert snapshot(run) == before_run and snapshot(shards) == before_data  # the text cache not rebuilt either


def test_a_run_started_before_shard_digests_says_so_once_and_continues(tmp_path, capsys):
    shards = tmp_path / "shards"
    prepare_synthetic(tiny(), shards)
    run = run_pretraining(tiny(f"data.shards={shards}", "train.stop_after=1"), tmp_path / "run")
    ckpt = checkpoint.checkpoints_in(run / "checkpoints")[-1]
    state = json.loads((ckpt / "state.json").read_text())
    state["data"] = {"folder": state["data"]["folder"], "manifest_sha256": state["data"]["manifest_sha256"]}
    (ckpt / "state.json").write_text(json.dumps(state))  # what a checkpoint of the older code holds
    capsys.readouterr()
    run_pretraining(resume_config(None, [f"train.resume={run}", "train.stop_after=2"])[0])
    notes = [line for line in capsys.readouterr().err.splitlines() if "before runs recorded" in line]
    assert len(notes) == 1 and "manifest.json alone this once" in notes[0]
    run_pretraining(resume_config(None, [f"train.resume={run}", "train.stop_after=3"])[0])
    assert "before runs recorded" not in capsys.readouterr().err  # its resume recorded them
    assert [int(r["step"]) for r in read_metrics(run / "metrics.csv")] == [1, 2, 3]
