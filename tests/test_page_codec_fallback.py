"""Issue 63 item 3: without a working ``zstandard`` (missing, or importable but broken: a missing
``libzstd.so``) a build stores PNG under ``.png`` member names and says so in one line; readers pick the
decoder by the first bytes, so shards of the old bug (PNG bytes under ``.zst`` names) still read; a
``zst`` page read without the package is one line naming the member and ``pip install zstandard``,
never "damaged"."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest

from gsdistill.tuples.errors import DataError
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.tuples.store import image_codec
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.store.writer import write_shards

ROOT = Path(__file__).resolve().parents[1]
# run inside the child before gsdistill is imported: what a missing or a broken package looks like
MISSING = "import sys; sys.modules['zstandard'] = None"
BROKEN = ("import sys, types\n"
          "class Broken(types.ModuleType):\n"
          "    def __getattr__(self, name):\n"
          "        raise OSError('libzstd.so.1: cannot open shared object file: No such file or directory')\n"
          "sys.modules['zstandard'] = Broken('zstandard')")


def _gsdistill(prelude: str, *args: str) -> subprocess.CompletedProcess:
    code = f"{prelude}\nfrom gsdistill.cli import main\nsys.exit(main({list(args)!r}))"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def _members(folder: Path) -> list[tuple[str, bytes]]:
    out = []
    for shard in sorted(folder.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            out += [(m.name, tar.extractfile(m).read()[:4]) for m in tar.getmembers()]
    return out


class _BrokenZstd(types.ModuleType):
    def __getattr__(self, name):
        raise OSError("libzstd.so.1: cannot open shared object file: No such file or directory")


@pytest.mark.parametrize("prelude, says", [(MISSING, "zstandard is not installed"),
                                           (BROKEN, "zstandard is installed but broken (OSError: libzstd.so.1")])
def test_build_without_working_zstandard_writes_png_under_png_names_in_one_line(tmp_path, prelude, says):
    out = tmp_path / "shards"
    r = _gsdistill(prelude, "tuples", "build", "--from", "synthetic", "6", "--out", str(out), "--workers", "2",
                   "--pages-per-shard", "3", "build.progress=false")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "zstandard" in line]
    assert len(lines) == 1 and says in lines[0] and "pip install zstandard" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    members = _members(out)
    images = [(name, head) for name, head in members if not name.endswith(".json")]
    assert len(images) == 6
    assert all(name.endswith(".png") and head == b"\x89PNG" for name, head in images), images
    assert len(list(read_pages(out))) == 6  # and they read back here, with zstandard


def _mislabelled_shard(folder: Path) -> None:
    """A shard as the old bug wrote it: PNG bytes under ``.zst`` member names (manifest included)."""
    write_shards(generate_pages(3, seed=2, width=200, height=240), folder, image_format="png", progress=False)
    shard = folder / "shard-000000.tar"
    with tarfile.open(shard) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(shard, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name.replace(".png", ".zst"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_png_bytes_under_zst_names_read_by_their_bytes(tmp_path):
    folder = tmp_path / "old"
    _mislabelled_shard(folder)
    assert any(name.endswith(".zst") for name, _ in _members(folder))
    got = list(read_pages(folder))
    want = generate_pages(3, seed=2, width=200, height=240)
    assert [np.asarray(p["image"].convert("RGB")).tolist() for p in got] == \
        [np.asarray(p["image"].convert("RGB")).tolist() for p in want]


@pytest.mark.parametrize("module", [None, _BrokenZstd("zstandard")], ids=["missing", "broken"])
def test_zst_page_read_without_working_zstandard_is_one_line_not_damaged(tmp_path, monkeypatch, module):
    folder = tmp_path / "zst"
    write_shards(generate_pages(2, seed=3, width=200, height=240), folder, image_format="zst", progress=False)
    monkeypatch.setitem(sys.modules, "zstandard", module)
    with pytest.raises(DataError) as e:
        list(read_pages(folder))
    message = str(e.value)
    assert "\n" not in message and "damaged" not in message
    assert f"{folder / 'shard-000000.tar'}: member " in message and ".zst:" in message
    assert "pip install zstandard" in message


def test_zst_page_in_pretraining_views_without_zstandard_names_the_package(tmp_path, monkeypatch):
    from gsdistill.views.batched_views import page_rgb
    folder = tmp_path / "zst"
    write_shards(generate_pages(1, seed=4, width=200, height=240), folder, image_format="zst", progress=False)
    page = next(read_pages(folder, decode_images=False))
    monkeypatch.setitem(sys.modules, "zstandard", _BrokenZstd("zstandard"))
    with pytest.raises(DataError, match="needs the zstandard package.*pip install zstandard") as e:
        page_rgb(page)
    assert "damaged" not in str(e.value)


def test_write_shards_without_zstandard_warns_once_and_names_members_png(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "zstandard", None)
    monkeypatch.setattr(image_codec, "_warned_png", False)
    with caplog.at_level("WARNING", logger="gsdistill.tuples"):
        write_shards(generate_pages(4, seed=5, width=200, height=240), tmp_path / "s", image_format="zst",
                     progress=False)
    assert len([r for r in caplog.records if "zstandard" in r.getMessage()]) == 1
    assert {name.rsplit(".", 1)[1] for name, _ in _members(tmp_path / "s")} == {"png", "json"}
