"""A training process opens no network connection, its DataLoader workers included (a cluster
without DNS): a tiny pretraining with 2 workers runs where every internet socket connect and every
name lookup raises, and records that none was tried. albumentations asks PyPI for its newest
version at import unless NO_ALBUMENTATIONS_UPDATE is set; ``import gsdistill`` sets it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_pretrain_data import TINY

REPO = Path(__file__).resolve().parents[1]
# imported by every interpreter started with this folder on PYTHONPATH (workers too: forked or spawned)
GUARD = '''
import os, socket
_log = os.environ["NETWORK_TRIES"]

def _refuse(what):
    with open(_log, "a") as fh:
        fh.write(f"{os.getpid()} {what}\\n")
    raise OSError(f"network is off in this test: {what}")

_connect = socket.socket.connect

def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _refuse(f"connect {address}")
    return _connect(self, address)

def getaddrinfo(host, *args, **kwargs):
    _refuse(f"getaddrinfo {host}")

socket.socket.connect = connect
socket.socket.connect_ex = lambda self, address: connect(self, address) or 0
socket.getaddrinfo = getaddrinfo
'''


def _guarded(tmp_path: Path, code: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    (tmp_path / "guard").mkdir(exist_ok=True)
    (tmp_path / "guard" / "sitecustomize.py").write_text(GUARD)
    log = tmp_path / "network_tries.txt"
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "NO_ALBUMENTATIONS_UPDATE"}
    env.update(PYTHONPATH=str(tmp_path / "guard"), NETWORK_TRIES=str(log), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, *code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return done, log.read_text()


def test_the_guard_sees_albumentations_ask_for_its_version(tmp_path):
    done, tries = _guarded(tmp_path, ["-c", "import albumentations"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "getaddrinfo pypi.org" in tries


def test_pretraining_with_two_workers_tries_no_connection(tmp_path):
    run_dir = tmp_path / "run"
    done, tries = _guarded(tmp_path, ["-m", "gsdistill.cli", "pretrain", "--run-dir", str(run_dir), *TINY,
                                      "data.num_workers=2", "optim.steps=2", "data.synthetic_pages=16"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (run_dir / "metrics.csv").is_file()
    assert tries == "", tries
