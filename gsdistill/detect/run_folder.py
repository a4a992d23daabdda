"""The folder a ``detect train`` run writes: a new one per run (an earlier run's ``best.pt`` and
``results.csv`` are never written over), checked against what the run reads, locked while it trains
(a second process gets the holder's PID), and removed again when the run fails before its first
checkpoint."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from ultralytics.utils.files import increment_path

from gsdistill.output_folder import LOCK_NAME, FolderBusy, OutputConflict, check_output_dir, lock_folder
from gsdistill.output_manifest import EVERYTHING
from gsdistill.output_removal import remove_written


def train_inputs(cfg, data: dict) -> list[tuple[str, Path]]:
    """What a fresh run reads (the data YAML, its split folders, backbone, model), which its run folder
    must neither be, lie in nor hold (plots inside a split folder would become training images)."""
    from gsdistill.detect.checks import split_dir
    inputs = [("data", Path(cfg.data))]
    inputs += [(f"data {s} split", split_dir(cfg.data, data, s))
               for s in ("train", "val", "test") if isinstance(data.get(s), str)]
    if cfg.backbone:
        inputs.append(("backbone", Path(cfg.backbone)))
    if cfg.model:
        inputs.append(("model", Path(cfg.model)))
    return inputs


def claim_run_dir(wanted: Path, inputs: list, held: contextlib.ExitStack) -> Path:
    """A new run folder for ``project/name``, locked for this process: ``wanted`` itself, or (as
    Ultralytics numbers them) ``name-2``, ``name-3``, ... when it exists, so an earlier run's
    ``best.pt`` and ``results.csv`` are never written over; the folder is printed. A folder another
    process has just taken is passed over (checked, then locked: two runs started together differ)."""
    for _ in range(100):
        run_dir = Path(increment_path(wanted))
        check_output_dir(run_dir, "project/name", inputs=inputs)
        attempt = contextlib.ExitStack()
        try:
            attempt.enter_context(lock_folder(run_dir))
        except FolderBusy:
            continue
        if any(p.name != LOCK_NAME for p in run_dir.iterdir()):  # made and filled since increment_path looked
            attempt.close()
            continue
        held.enter_context(attempt.pop_all())
        note = f" ({wanted} exists: the earlier run there is kept)" if run_dir != wanted else ""
        print(f"[detect] run dir: {run_dir}{note}", file=sys.stderr, flush=True)
        return run_dir
    raise OutputConflict(f"project/name {wanted}: no free run folder name found; give another name=")


@contextlib.contextmanager
def removed_unless_resumable(run_dir: Path):
    """A run that fails before its first checkpoint leaves no ``head_only-N`` folder behind (the next
    run would take another number); one with ``weights/last.pt`` stays, to be resumed."""
    try:
        yield
    except BaseException:
        if not (run_dir / "weights" / "last.pt").is_file():
            remove_written(run_dir, EVERYTHING)  # what this run wrote (never through a link); the lock removes
        raise                                    # the folder once it is empty
