"""The output folder of ``detect convert``: checked against the inputs, locked, and never mixed with or
written over a conversion of other data without ``--overwrite``.

``manifest.json`` records, per split, the ``source`` it was converted from (the COCO json, the shard
or DocBank folder, the synthetic settings; None from Python callers that name none). Before anything
is written:

* a folder that holds files but no conversion manifest is refused (its ``images/`` or ``labels/``
  could be the user's own);
* a conversion that owns the whole folder (a random train/val split, page tuples, a release) replaces
  the folder's earlier conversion of the *same* source; one of other data (another source, other
  class names, or a split this conversion would leave beside its own) is refused unless
  ``overwrite``;
* ``--split S`` adds or replaces split S only (the documented way to build a folder from one json
  per official split): an S converted from another source is refused unless ``overwrite``.

``overwrite`` removes only what ``detect convert`` wrote (by the folder's record,
:mod:`gsdistill.output_manifest`; in a folder from before records, the names of :data:`CONVERT`), or
one split of it; never through a link (an image link goes, never the image), never a file of the
user's. A name the conversion writes that is the user's (``data.yaml``, a link where ``images/``
goes) is refused, ``overwrite`` or not.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gsdistill.detect.image_check import MEMO
from gsdistill.output_folder import OutputConflict, check_claim, check_output_dir, lock_folder
from gsdistill.output_manifest import Layout
from gsdistill.output_removal import inventory, remove_written

CONVERT_OUTPUTS = ("images", "labels", "coco", "manifest.json", "coco_eval.json", "data.yaml", "_staging", MEMO)
CONVERT = Layout("detect convert", CONVERT_OUTPUTS,
                 ("images/*/*", "labels/*/*.txt", "labels/*.cache", "coco/*.json", "manifest.json", "coco_eval.json",
                  "data.yaml", "_staging/*", MEMO), ("manifest.json",))
_OVERWRITE_HINT = ("give another --out, or --overwrite to replace it (removes only what detect convert wrote "
                   "there)")


def read_manifest(out: Path) -> dict | None:
    """The conversion manifest of ``out``; None when there is none (or it is not a converter's)."""
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(manifest, dict) and isinstance(manifest.get("names"), list) \
            and isinstance(manifest.get("splits"), dict):
        return manifest
    return None


@contextmanager
def conversion_output(out: str | Path, inputs: list[tuple[str, str | Path]] = ()) -> Iterator[Path]:
    """``out`` checked against ``inputs`` (``(label, path)``) and locked while the block writes it; a
    folder this call created is removed again when the block fails before writing anything into it."""
    out = check_output_dir(out, "--out", inputs=inputs)
    with lock_folder(out):  # which removes the folder again when it made it and the block leaves it empty
        yield out


def claim(out: Path, names: list[str], sources: dict[str, str | None], whole: bool, overwrite: bool) -> None:
    """Make ``out`` ready for a conversion writing the splits of ``sources`` (split -> source) with class
    ``names``; ``whole``: it owns the folder (no other split may stay). Refuse, or remove the earlier
    conversion this one replaces (module doc)."""
    inv = inventory(out, CONVERT)
    if not inv.entries:
        return
    manifest = read_manifest(out) if "manifest.json" in inv.ours else None
    if manifest is None:
        present = sorted(p for p in inv.entries if "/" not in p)
        raise OutputConflict(f"--out {out}: holds files that are not a detect convert output (e.g. {present[0]}); "
                             "give a new or empty folder")
    check_claim(out, "--out", CONVERT, overwrite=True)  # a name it writes that is the user's: refused always
    old = {s: st.get("source") for s, st in manifest["splits"].items()}
    if manifest["names"] != list(names):
        conflict = f"classes {manifest['names']}, not {list(names)}"
    else:
        other = [s for s, src in old.items() if (whole or s in sources) and sources.get(s, _NONE) != src]
        conflict = ""
        if other:
            s = other[0]
            now = f"not {sources[s] or 'unnamed data'}" if s in sources else "a split this conversion leaves as it is"
            conflict = f"split '{s}' converted from {old[s] or 'unnamed data'}, {now}"
    if conflict and not overwrite:
        raise OutputConflict(f"--out {out}: already holds another conversion ({conflict}); {_OVERWRITE_HINT}")
    if whole or manifest["names"] != list(names):
        remove_conversion(out)
        (out / "manifest.json").write_text(json.dumps({"names": list(names), "splits": {}}, indent=1))
    else:
        for split in sources:
            remove_split(out, split, manifest)


_NONE = object()  # a split this conversion does not write


def remove_conversion(out: Path) -> None:
    """Delete what ``detect convert`` wrote in ``out`` (never through a link), nothing else."""
    remove_written(out, CONVERT)


def remove_split(out: Path, split: str, manifest: dict) -> None:
    """Delete one split of a conversion (labels, image links, its COCO json, manifest and sidecar entries)."""
    remove_written(out, CONVERT, [f"images/{split}", f"labels/{split}", f"labels/{split}.cache",
                                  f"coco/{split}.json", MEMO])
    if split in manifest["splits"]:
        manifest["splits"].pop(split)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    sidecar_path = out / "coco_eval.json"
    if sidecar_path.is_file():
        sidecar = json.loads(sidecar_path.read_text())
        if sidecar.pop(split, None) is not None:
            sidecar_path.write_text(json.dumps(sidecar, indent=1))
