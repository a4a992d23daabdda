"""``tools/gpu/lease.py`` (one GPU sitting: the engine, then the science) rehearsed on the CPU at toy size, so
that a sitting fails on nothing but the GPU; the pages' travel format (``lease_pages.py``) and the travel
measure of ``lease_prepare.py``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tool_loader import load_tool

ROOT = Path(__file__).resolve().parents[1]
# what the offline GPU image lacks and no carried archive brings (../shared/gpu/README.md): the rehearsal makes
# importing them fail, as it fails there, so a top-level import on the lease's path shows here
ABSENT_ON_THE_GPU = ("pymupdf", "fitz", "pytesseract", "faiss", "bm25s", "pytrec_eval", "ray")


def synthetic_split(root: Path) -> Path:
    """``root/{train,eval}``: shards of synthetic pages, other documents in each (another seed)."""
    from gsdistill.tuples.sources.synthetic import generate_pages
    from gsdistill.tuples.store.writer import write_shards

    write_shards(generate_pages(8, seed=0, width=256, height=320), root / "train", progress=False)
    write_shards(generate_pages(8, seed=1000, width=256, height=320), root / "eval", progress=False)
    return root


def test_pages_travel_as_raw_pixels_and_come_back_as_the_same_shards(tmp_path):
    from gsdistill.tuples.store.reader import list_shards, read_pages, shard_digest

    lease_pages = load_tool("gpu/lease_pages.py")
    built = synthetic_split(tmp_path / "built")
    bundle = tmp_path / "pages.tar.xz"
    assert lease_pages.pack_bundle(built, bundle) == {"train": 8, "eval": 8}
    pages, codec = lease_pages.unpack_bundle(bundle, tmp_path / "there")
    assert (pages, codec) == ({"train": 8, "eval": 8}, "zst")
    for split in ("train", "eval"):
        here, there = list_shards(built / split), list_shards(tmp_path / "there" / split)
        assert [shard_digest(s) for s in here] == [shard_digest(s) for s in there]  # the text cache's keys
        for a, b in zip(read_pages(built / split), read_pages(tmp_path / "there" / split), strict=True):
            assert a["id"] == b["id"] and a["spans"] == b["spans"]
            assert np.array_equal(np.asarray(a["image"]), np.asarray(b["image"]))


def test_without_zstandard_the_pages_come_back_as_png(tmp_path):
    lease_pages = load_tool("gpu/lease_pages.py")
    name, body = lease_pages._from_raw(None)("p-0001.npy", _npy(np.full((4, 5, 3), 7, np.uint8)))
    assert name == "p-0001.png" and body[:8] == b"\x89PNG\r\n\x1a\n"


def _npy(a: np.ndarray) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_what_travels_counts_tracked_untracked_and_carried_files_not_ignored_ones(tmp_path):
    prep = load_tool("gpu/lease_prepare.py")
    repo = tmp_path / "repo"
    (repo / ".gpu").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / ".gitignore").write_text("/.gpu/\nruns/\n")
    (repo / "a.py").write_bytes(b"x" * 100)
    subprocess.run(["git", "add", "a.py", ".gitignore"], cwd=repo, check=True)
    (repo / "new.md").write_bytes(b"y" * 30)  # untracked, not ignored: travels
    (repo / "runs").mkdir()
    (repo / "runs" / "big").write_bytes(b"z" * 5000)  # ignored: stays
    (repo / ".gpu" / "site.tar.xz").write_bytes(b"w" * 700)  # carried
    sizes = prep.travel_bytes(repo, [".gpu"])
    assert sizes == {"tracked tree": 100 + len("/.gpu/\nruns/\n"), "untracked, not ignored": 30, "carried .gpu/": 700}
    assert prep.check_travel(repo, [".gpu"], budget_mib=1, margin_mib=0.5) == 0
    assert prep.check_travel(repo, [".gpu"], budget_mib=0.0005, margin_mib=0) == 2


@pytest.mark.timeout(1800)  # ~12 processes that each import torch: minutes on a shared 2-core machine
def test_the_lease_rehearses_every_part_on_the_cpu(tmp_path):
    """A and B end to end at toy size: every target of the sitting gets a row, every stage its numbers."""
    prep, lease_pages = load_tool("gpu/lease_prepare.py"), load_tool("gpu/lease_pages.py")
    built = synthetic_split(tmp_path / "built")
    bundle = tmp_path / "carried" / "pages.tar.xz"
    bundle.parent.mkdir()
    lease_pages.pack_bundle(built, bundle)
    (bundle.parent / "pages.json").write_text(json.dumps({"text_height_px": prep.text_heights(built, 72)}))
    absent = tmp_path / "absent"
    absent.mkdir()
    for name in ABSENT_ON_THE_GPU:
        (absent / f"{name}.py").write_text('raise ImportError("absent on the offline GPU machine")\n')
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu" / "lease.py"), "--cpu", "--out", str(out),
                          "--work", str(tmp_path / "work"), "--bundle", str(bundle)], capture_output=True, text=True, cwd=ROOT, timeout=3600,
                         env={**os.environ, "PYTHONPATH": f"{absent}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                              "YOLO_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    report = (out / "lease.md").read_text() if (out / "lease.md").is_file() else run.stdout
    assert run.returncode == 0, (report + run.stderr)[-3000:]
    state = json.loads((out / "lease.json").read_text())
    assert [p for p in state["parts"]] == ["A. the engine", "B. the science"]
    assert all(p.get("state") == "" for p in state["parts"].values()), report
    engine, science = state["parts"]["A. the engine"]["data"], state["parts"]["B. the science"]["data"]
    assert engine["compiled_default"]["recompiles"] == 0 and engine["compiled_default"]["share"] > 0
    assert set(engine["eager_step_s"]) == {"torch", "deepspeed"}
    assert science["pretrain"]["steps"] == science["control"]["steps"] == 3
    assert {"backbone", "reference"} <= set(science["detect"]["paired"])
    assert {"geom@None", "sem@1", "sem@5", "sem@8"} == set(science["retrieval"]["gains"])
    targets = {t["target"]: t for t in state["targets"]}
    for what in ("loop >= 30 % of the bf16 peak (compiled, batch 128)", "first fast step <= 60 s after the start (cold cache)",
                 "0 recompiles", "data wait <= 2 ms (median)", "DeepSpeed default <= 1.3x the torch step",
                 "eager batch 64 <= 0.12 s", "pretrained - random twin >= +5 mAP@50 (held-out)",
                 "head-only >= the stock YOLOv10n (held-out)"):
        assert targets[what]["met"] in (True, False), what
    assert re.search(r"\| semantic retrieval from 5 crops >= 3x chance .*\| \*\*(met|missed)\*\* \|", report)
    assert (out / "logs" / "science" / "pretrain.log").is_file()  # the logs come back; the runs stay in --work
    assert not (out / "science").exists()
    assert re.search(r"Text in the recipe's 512 px global view .*: Title [\d.]+", report)


def test_the_lease_names_what_it_lacks_in_one_line_before_any_work(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu" / "lease.py"), "--cpu", "--parts", "B",
                          "--out", str(tmp_path / "out"), "--bundle", str(tmp_path / "nowhere.tar.xz")],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == (f"lease: missing: the carried pages {tmp_path / 'nowhere.tar.xz'} "
                                                   "(run tools/gpu/lease_prepare.py here, carry .gpu)")
    assert not (tmp_path / "out" / "lease.md").exists()
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu" / "lease.py"), "--parts", "C"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (bad.returncode, bad.stderr.strip()) == (2, "lease: --parts 'C': give A, B or AB")
