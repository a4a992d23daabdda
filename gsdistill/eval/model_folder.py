"""What ``eval retrieval --model`` was given, when it is not a pretraining run: page retrieval needs a
``gsdistill pretrain`` run (or one of its checkpoints) with its page and text heads. A text-retriever
folder, an exported backbone or a detection run each get one line saying what they are and which
command takes them, instead of an error about a config key the folder was never meant to have."""
from __future__ import annotations

from pathlib import Path

from gsdistill.errors import InputError

NEEDS = "eval retrieval takes a 'gsdistill pretrain' run folder or one of its checkpoints"
# the file a saved text retriever holds (gsdistill.retriever.model.CONFIG_NAME); spelled out here since
# the retriever sits above this package (it scores with eval's index and metrics); a test keeps them equal
RETRIEVER_CONFIG = "dual_encoder.json"


def _retriever_marker(folder: Path, cfg: dict) -> str | None:
    for cand in (folder, folder / "model"):  # the model folder, or the run dir holding it
        if (cand / RETRIEVER_CONFIG).is_file():
            return str(cand / RETRIEVER_CONFIG)
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    if "encoder" in model and "backbone" not in model:  # a retriever's saved config (run or checkpoint)
        return "its config.yaml has model.encoder, no model.backbone"
    return None


def check_pretraining_folder(model_dir: Path, run_cfg: dict) -> None:
    """InputError naming ``model_dir`` and what it is, when it is not a pretraining run."""
    from gsdistill.models.backbone import META  # backbone.json

    folder = Path(model_dir)
    if not folder.is_dir():
        raise InputError(f"--model {folder}: no such folder; {NEEDS}")
    marker = _retriever_marker(folder, run_cfg)
    if marker:
        raise InputError(f"--model {folder}: a text-retriever folder ({marker}), not a pretraining run; "
                         f"score it with 'gsdistill retriever eval --model {folder}'; {NEEDS}")
    if (folder / META).is_file():
        raise InputError(f"--model {folder}: an exported backbone ({META}) without the page and text heads; "
                         f"{NEEDS} (the folder it was exported from)")
    if (folder / "weights").is_dir() and (folder / "args.yaml").is_file():
        raise InputError(f"--model {folder}: a detection run (weights/, args.yaml), not a pretraining run; {NEEDS}")
