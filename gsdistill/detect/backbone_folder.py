"""An exported backbone folder as detection reads it: its ``backbone.json``, checked before any run
folder is made, so a damaged or foreign file is one line naming it (json's own errors name no file,
and a description without ``model_name`` or with a model timm cannot build was a traceback)."""
from __future__ import annotations

from pathlib import Path

from gsdistill.errors import CorruptFileError


def read_backbone_folder(path: str | Path) -> dict:
    """``backbone.json`` of an exported backbone folder (or of the folder holding a file ``path``)."""
    from gsdistill.models.backbone import META, read_backbone_meta
    from gsdistill.pretrain.config_checks import check_backbone

    folder = Path(path).parent if Path(path).is_file() else Path(path)
    meta_path = folder / META
    meta = read_backbone_meta(folder)  # unreadable JSON or not an object: a CorruptFileError naming it
    if not isinstance(meta.get("model_name"), str) or not isinstance(meta.get("kwargs"), dict):
        raise CorruptFileError(f"{meta_path}: no model_name (a timm name) and kwargs (an object); "
                               "export the backbone again ('gsdistill export')")
    check_backbone({**meta["kwargs"], "name": meta["model_name"]}, key=f"{meta_path}: model")
    return meta
