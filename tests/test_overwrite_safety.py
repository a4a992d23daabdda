"""Issue 63, item 1 (and the rows of its table that are about removal): ``--overwrite``, a rebuild, a
split or a conversion replaced never reach past what gsdistill wrote. Removal walks the real folder
without following a link (a link may go, never what it points to), never leaves the output folder,
and removes only what the folder's record says gsdistill wrote there; the user's files stay byte
for byte, even inside a run's own sub-folders. Also: ``tuples info`` after a rebuild calls a stale
embedding cache stale, and an output that cannot be made is one line, exit 2, nothing left behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gsdistill.cli import main as gsdistill
from gsdistill.output_folder import OutputConflict, lock_folder
from retriever_fixtures import tiny_beir, tiny_encoder  # noqa: F401  (fixtures)

RECORD_NAME = ".gsdistill-files"  # gsdistill.output_manifest.RECORD_NAME (the tests also run on code without it)
SMALL = ["build.progress=false", "synthetic.width=200", "synthetic.height=260"]


def tree(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (links not followed) with its bytes, the record and lock left out."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in files:
            path = Path(root) / name
            if name in (RECORD_NAME, ".gsdistill.lock") and path.parent == folder:
                continue
            rel = path.relative_to(folder).as_posix()
            out[rel] = ("link -> " + os.readlink(path)).encode() if path.is_symlink() else path.read_bytes()
    return out


def user_folder(path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def synthetic(out, pages=8, *extra) -> int:
    return gsdistill(["tuples", "build", "--from", "synthetic", str(pages), "--out", str(out), "--workers", "1",
                      *SMALL, *extra])


# ---- the helper ------------------------------------------------------------------------------------------
def test_what_a_held_folder_gains_is_recorded_and_only_that_is_removed(tmp_path):
    from gsdistill.output_manifest import read_record
    from gsdistill.output_removal import remove_written
    out = user_folder(tmp_path / "out", {"mine.txt": "mine", "sub/mine.txt": "mine too"})
    with lock_folder(out):
        (out / "sub" / "ours.bin").write_bytes(b"1")
        (out / "new").mkdir()
        (out / "new" / "ours.txt").write_text("2")
    rec = read_record(out)
    assert rec["written"] == {"sub/ours.bin", "new", "new/ours.txt"}
    assert rec["unknown"] == {"mine.txt", "sub", "sub/mine.txt"}  # there before the folder had a record
    (out / "later.txt").write_text("added by the user between two commands")
    removal = remove_written(out)
    assert sorted(removal.removed) == ["new/", "new/ours.txt", "sub/ours.bin"]
    assert sorted(removal.kept) == ["later.txt", "mine.txt", "sub/mine.txt"]
    assert tree(out) == {"mine.txt": b"mine", "sub/mine.txt": b"mine too", "later.txt":
                         b"added by the user between two commands"}


def test_removal_never_follows_a_link_nor_leaves_the_folder(tmp_path):
    from gsdistill.output_manifest import EVERYTHING
    from gsdistill.output_removal import remove_written
    elsewhere = user_folder(tmp_path / "elsewhere", {"a.npz": "user", "meta.json": "user"})
    out = tmp_path / "out"
    with lock_folder(out):  # gsdistill made these links itself: they are ours, their targets are not
        (out / "link_dir").symlink_to(elsewhere)
        (out / "link_file").symlink_to(elsewhere / "a.npz")
    before = tree(elsewhere)
    removal = remove_written(out, EVERYTHING)
    assert sorted(removal.removed) == ["link_dir", "link_file"]
    assert tree(elsewhere) == before and not os.path.lexists(out / "link_dir")
    # a folder gsdistill never recorded, with links into the user's folders: nothing is ours, nothing goes
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "units").symlink_to(elsewhere)
    assert not remove_written(legacy, EVERYTHING, ["units/a.npz"]).removed  # below a link: not looked at
    assert tree(elsewhere) == before


def test_a_sub_folders_own_record_counts_only_below_a_folder_of_ours(tmp_path):
    from gsdistill.output_removal import remove_written
    run = tmp_path / "run"
    with lock_folder(run):  # a run makes its data/ ...
        (run / "data").mkdir()
        (run / "data" / "manifest.json").write_text("{}")
    with lock_folder(run / "data"):  # ... which is embedded later under the data folder's own lock
        (run / "data" / "embeddings").mkdir()
        (run / "data" / "embeddings" / "meta.json").write_text("{}")
    proj = user_folder(tmp_path / "proj", {"notes.md": "mine"})
    with lock_folder(proj / "shards"):  # a build of the user's inside their own project folder
        (proj / "shards" / "manifest.json").write_text("{}")
    with lock_folder(proj):
        (proj / "report.md").write_text("gsdistill's")
    assert remove_written(run).kept == [] and not (run / "data").exists()
    removal = remove_written(proj)
    assert removal.removed == ["report.md"]
    assert tree(proj) == {"notes.md": b"mine", "shards/manifest.json": b"{}", "shards/.gsdistill-files":
                          (proj / "shards" / ".gsdistill-files").read_bytes()}


def test_what_a_killed_holder_wrote_is_credited_to_it(tmp_path):
    from gsdistill.output_removal import inventory
    out = user_folder(tmp_path / "out", {"mine.txt": "mine"})
    os.utime(out / "mine.txt", (1, 1))  # older than the killed session
    code = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from gsdistill.output_folder import lock_folder
        with lock_folder(sys.argv[1]):
            (Path(sys.argv[1]) / "half.bin").write_bytes(b"x")
            print("written", flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with lock_folder(out):  # the dead holder's lock is taken over, its file credited to it
        inv = inventory(out)
        assert "half.bin" in inv.ours and "mine.txt" not in inv.ours


# ---- row: tuples build --overwrite where units/ and embeddings/ are links to the user's folders -------------
def test_build_overwrite_never_deletes_or_writes_through_links(tmp_path, capsys):
    out = tmp_path / "D"
    assert synthetic(out, 8) == 0
    theirs = {name: user_folder(tmp_path / f"their_{name}", {"plan.json": "their plan", "unit-0.json": "their unit",
                                                             "meta.json": "their meta", "x.npz": "their vectors"})
              for name in ("units", "embeddings")}
    for name, target in theirs.items():
        os.rename(out / name, tmp_path / f"old_{name}") if (out / name).exists() else None
        (out / name).symlink_to(target)
    before = {name: tree(target) for name, target in theirs.items()}
    capsys.readouterr()
    for extra in (("--overwrite",), (), ("synthetic.seed=3",)):
        rc = synthetic(out, 4, *extra)
        assert {name: tree(target) for name, target in theirs.items()} == before, extra  # nothing deleted or added
        assert rc == 2, extra
        line = one_line(capsys)
        assert "link" in line and str(out) in line
    assert all((out / name).is_symlink() for name in theirs)


# ---- row: --overwrite of a real run holding the user's file inside backbone/ or plots/ (pretraining) ---------
TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32",
        "optim.batch_size=4", "optim.steps=2", "optim.warmup_steps=1", "train.log_every=1",
        "train.progress=false", "train.tensorboard=false", "threads=1"]


def _pretrain(run_dir, *extra, **kw):
    from gsdistill.config import load_config
    from gsdistill.pretrain.data_stream import FixedBatches, tensor_batch
    from gsdistill.pretrain.run import run_pretraining
    cfg = load_config("pretrain", None, TINY + list(extra))
    batches = [tensor_batch(cfg, 4, seed=s) for s in range(2)]
    return run_pretraining(cfg, run_dir, lambda rank, world: FixedBatches(batches, rank, world), **kw)


def test_pretrain_overwrite_keeps_the_users_files_inside_the_runs_folders(tmp_path, capsys):
    run = _pretrain(tmp_path / "run", "train.plots=true", "train.ckpt_every=1")
    assert (run / "backbone").is_dir() and (run / "plots").is_dir()
    mine = {"backbone/README.md": "my notes on this backbone", "plots/annotated.png": "my figure",
            "checkpoints/NOTE.txt": "keep", "notes.txt": "mine"}
    user_folder(run, mine)
    _pretrain(run, "train.plots=true", "optim.steps=1", overwrite=True)
    after = tree(run)
    assert {k: after.get(k) for k in mine} == {k: v.encode() for k, v in mine.items()}
    assert (run / "backbone" / "backbone.safetensors").is_file()  # the new run's own files are there
    assert "kept 4 files gsdistill did not write" in capsys.readouterr().err


# ---- row: --overwrite of a retriever run holding the user's file inside eval/ ---------------------------------
def test_retriever_overwrite_keeps_the_users_file_inside_eval(tiny_beir, tiny_encoder, tmp_path):
    from test_reliability_round3_retriever import _train
    run = tmp_path / "runs" / "r"
    assert _train(tmp_path, tiny_beir, tiny_encoder) == 0
    assert (run / "eval").is_dir()
    user_folder(run, {"eval/my_analysis.ipynb": "{}", "model/MY_CARD.md": "mine"})
    assert _train(tmp_path, tiny_beir, tiny_encoder, "--overwrite", "train.seed=3") == 0
    assert (run / "eval" / "my_analysis.ipynb").read_text() == "{}"
    assert (run / "model" / "MY_CARD.md").read_text() == "mine"


# ---- row: eval split --overwrite into a folder holding the user's config.yaml and skipped.csv only ------------
def test_split_overwrite_keeps_files_a_split_never_writes(tmp_path, capsys):
    assert synthetic(tmp_path / "all", 8) == 0
    held = user_folder(tmp_path / "held", {"config.yaml": "my: config\n", "skipped.csv": "my,list\n"})
    before = tree(held)
    args = ["eval", "split", str(tmp_path / "all"), "--train-out", str(tmp_path / "train"), "--eval-out", str(held),
            "--fraction", "0.5"]
    capsys.readouterr()
    assert gsdistill(args) == 2  # files gsdistill did not write: not without --overwrite
    assert "did not write" in one_line(capsys) and tree(held) == before and not (tmp_path / "train").exists()
    assert gsdistill(args + ["--overwrite"]) == 0
    after = tree(held)
    assert {k: after[k] for k in before} == before
    assert "manifest.json" in after and "split.json" in after


# ---- row: tuples info after a rebuild lists the stale embedding cache as valid ---------------------------------
def _embed_like_tuples_embed(folder: Path) -> None:
    """An embedding cache keyed by the shards' content digests now (what ``tuples embed`` writes)."""
    from gsdistill.tuples.descriptors import DESCRIPTOR_VERSION
    from gsdistill.tuples.store.reader import read_manifest, shard_digest
    from gsdistill.tuples.store.text_cache import CacheWriter, cache_key
    names = [s["name"] for s in read_manifest(folder)["shards"]]
    with lock_folder(folder):
        writer = CacheWriter(folder, [Path(n).stem for n in names])
        for n in names:
            writer.write_shard(Path(n).stem, {"k.sem": np.zeros((1, 4), np.float32)})
        writer.finish(cache_key("enc", DESCRIPTOR_VERSION, None, {n: shard_digest(folder / n) for n in names}), 4,
                      ("sem", "geom"))


def test_tuples_info_after_a_rebuild_calls_the_cache_stale(tmp_path, capsys):
    out = tmp_path / "shards"
    assert synthetic(out, 8) == 0
    _embed_like_tuples_embed(out)
    capsys.readouterr()
    assert gsdistill(["tuples", "info", str(out)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("embeddings:")][0]
    assert "STALE" not in line and "current" in line
    assert synthetic(out, 8, "synthetic.seed=5") == 0  # the same input, another setting: rebuilt
    capsys.readouterr()
    assert gsdistill(["tuples", "info", str(out)]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("embeddings:")][0]
    assert "STALE" in line and "changed since they were embedded" in line and "tuples embed" in line


# ---- row: an output that cannot be created is one line, exit 2, no empty folder left ---------------------------
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_an_output_that_cannot_be_made_is_one_line(tmp_path, capsys, tiny_beir, tiny_encoder):
    capsys.readouterr()
    assert synthetic("/proc/gsdistill-x/shards", 4) == 2
    assert "/proc/gsdistill-x" in one_line(capsys)
    assert gsdistill(["pretrain", "--run-dir", "/proc/gsdistill-x/run", *TINY]) == 2
    assert "/proc/gsdistill-x" in one_line(capsys)
    assert gsdistill(["retriever", "eval", f"data.path={tiny_beir}", f"model.encoder={tiny_encoder}", "threads=1",
                      "--out", "/proc/gsdistill-x/eval"]) == 2
    assert "/proc/gsdistill-x" in one_line(capsys)
    pages = tmp_path / "pages"
    pages.mkdir()
    assert gsdistill(["eval", "retrieval", "--model", str(tmp_path), "--pages", str(pages),
                      "--out", "/proc/gsdistill-x/report"]) == 2
    assert "/proc/gsdistill-x" in one_line(capsys)


def test_a_compile_cache_that_is_a_file_is_one_line_and_leaves_no_run_folder(tmp_path, capsys):
    (tmp_path / "cache").write_text("a file")
    run = tmp_path / "runs" / "r"
    capsys.readouterr()
    assert gsdistill(["pretrain", "--run-dir", str(run), *TINY, f"train.compile_cache={tmp_path / 'cache'}"]) == 2
    line = one_line(capsys)
    assert "train.compile_cache" in line and str(tmp_path / "cache") in line
    assert not (tmp_path / "runs").exists() and (tmp_path / "cache").read_text() == "a file"


def test_a_lock_file_that_is_a_folder_is_one_line(tmp_path, capsys):
    out = tmp_path / "shards"
    (out / ".gsdistill.lock").mkdir(parents=True)
    capsys.readouterr()
    assert synthetic(out, 4) == 2
    assert ".gsdistill.lock" in one_line(capsys)
    with pytest.raises(OutputConflict):
        with lock_folder(out):
            pass
