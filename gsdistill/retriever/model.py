"""Dual encoder over any Hugging Face encoder: shared or separate query / passage towers.

``score(q, p) = scale * <e_q, e_p>`` where ``e`` is the CLS or mean-pooled last hidden state
(L2-normalised when ``normalize``) and ``scale = 1 / temperature`` (``gsdistill.losses.LogitScale``,
optionally learnable). A frozen passage tower (``freeze_passage``) lets training reuse cached
passage embeddings (query-side fine-tuning), which is what makes CPU experiments affordable.

Saved layout (``save_pretrained(dir)``), opened by sentence-transformers as well as by this class:

- shared tower: ``dir`` itself is a complete sentence-transformers model (Transformer, Pooling,
  Normalize, ``max_seq_length = passage_max_length``): ``SentenceTransformer(dir)`` and
  ``AutoModel.from_pretrained(dir)`` both load it;
- separate towers: ``dir/query_encoder/`` and ``dir/passage_encoder/`` are each a complete
  sentence-transformers model (``max_seq_length`` = the tower's max length): encode queries with
  ``SentenceTransformer(dir + "/query_encoder")`` and passages with
  ``SentenceTransformer(dir + "/passage_encoder")``;

plus ``dir/dual_encoder.json`` (pooling, normalisation, temperature, max lengths) and
``dir/README.md`` (model card: base model, data, loss, metrics, how to load).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from gsdistill.errors import no_room, no_room_error
from gsdistill.losses import LogitScale
from gsdistill.models.text_encoder import mean_pool, resolve_encoder

CONFIG_NAME = "dual_encoder.json"


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    if pooling == "mean":
        return mean_pool(hidden, attention_mask)
    if pooling == "cls":
        return hidden[:, 0]
    raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")


class DualEncoder(nn.Module):
    """``encode_queries(texts) / encode_passages(texts) -> float[N, D]``; ``scores(q, p) -> logits``."""

    def __init__(self, encoder: str | None = None, shared: bool = True, pooling: str = "mean",
                 normalize: bool = True, temperature: float = 0.05, learn_temperature: bool = False,
                 query_max_length: int = 64, passage_max_length: int = 128, freeze_passage: bool = False,
                 train_top_layers: int = -1, _passage_path: str | None = None):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        self.base_name = encoder or "all-MiniLM-L6-v2"
        path = resolve_encoder(encoder)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.query_encoder = AutoModel.from_pretrained(path, local_files_only=True)
            self.passage_encoder = (None if shared else
                                    AutoModel.from_pretrained(_passage_path or path, local_files_only=True))
        except OSError as e:
            raise RuntimeError(f"encoder '{self.base_name}' not found locally ({path}): {e}") from None
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        if shared and freeze_passage:
            raise ValueError("freeze_passage needs separate towers (shared=false): a shared tower is the query tower")
        self.shared, self.pooling, self.normalize = shared, pooling, normalize
        self.query_max_length, self.passage_max_length = query_max_length, passage_max_length
        self.freeze_passage = freeze_passage
        self.logit_scale = LogitScale(init_temperature=temperature, learnable=learn_temperature,
                                      max_scale=max(100.0, 1.0 / temperature))
        if freeze_passage:
            self.passage_encoder.requires_grad_(False)
        self.train_top_layers = train_top_layers
        if train_top_layers >= 0:  # fewer trainable weights: less drift from the pretrained tower
            freeze_lower_layers(self.query_encoder, train_top_layers)

    def train(self, mode: bool = True) -> "DualEncoder":
        super().train(mode)
        if self.freeze_passage:  # a frozen tower is a fixed function: never dropout
            self.passage_encoder.eval()
        return self

    @property
    def passage_tower(self) -> nn.Module:
        return self.query_encoder if self.passage_encoder is None else self.passage_encoder

    @property
    def device(self) -> torch.device:
        return next(self.query_encoder.parameters()).device

    def tokenize(self, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
        batch = self.tokenizer([t or " " for t in texts], padding=True, truncation=True,
                               max_length=max_length, return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items()}

    def embed(self, tower: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = tower(**batch).last_hidden_state
        emb = pool(hidden, batch["attention_mask"], self.pooling).float()
        return F.normalize(emb, dim=-1) if self.normalize else emb

    def encode_queries(self, texts: list[str]) -> torch.Tensor:
        return self.embed(self.query_encoder, self.tokenize(texts, self.query_max_length))

    def encode_passages(self, texts: list[str]) -> torch.Tensor:
        return self.embed(self.passage_tower, self.tokenize(texts, self.passage_max_length))

    def scores(self, q_emb: torch.Tensor, p_emb: torch.Tensor) -> torch.Tensor:
        """Logits ``[Q, P]`` = scale * inner products."""
        return self.logit_scale(q_emb @ p_emb.T)

    @torch.no_grad()
    def encode(self, texts: list[str], kind: str, batch_size: int = 64, progress: bool = False) -> torch.Tensor:
        """Inference encoding in length-sorted batches (less padding); ``kind`` is query|passage."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        fn = self.encode_queries if kind == "query" else self.encode_passages
        was_training = self.training
        self.eval()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        starts = range(0, len(texts), batch_size)
        if progress:
            from tqdm import tqdm
            starts = tqdm(starts, desc=f"encode {kind}s", unit="batch")
        parts = [fn([texts[i] for i in order[s:s + batch_size]]).cpu() for s in starts]
        self.train(was_training)
        dim = int(self.query_encoder.config.hidden_size)
        emb = torch.cat(parts) if parts else torch.zeros(0, dim)
        out = torch.empty_like(emb)
        out[torch.tensor(order, dtype=torch.long)] = emb
        return out

    def settings(self) -> dict:
        return {"base_model": self.base_name, "shared": self.shared, "pooling": self.pooling,
                "normalize": self.normalize, "temperature": self.logit_scale.temperature,
                "learn_temperature": bool(self.logit_scale.log_scale.requires_grad),
                "query_max_length": self.query_max_length, "passage_max_length": self.passage_max_length,
                "freeze_passage": self.freeze_passage, "train_top_layers": self.train_top_layers}

    def save_pretrained(self, out_dir: str | Path, card: dict | None = None, also=None) -> Path:
        """Write the saved layout (module doc); ``card`` adds data / loss / metrics to README.md; ``also(folder)``
        writes more files into it (the run's config). Written into a temporary sibling folder and renamed
        into place when complete: a full disk (one line naming the file and the free space) leaves the
        model that was there, or none, never a folder without weights."""
        out = Path(out_dir)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        _remove_partial(tmp)
        try:
            self._write(tmp, card)
            if also is not None:
                also(tmp)
        except Exception as e:
            where = _failed_file(tmp, e)
            why = no_room(e, where)
            _remove_partial(tmp)
            if why is None:
                raise
            raise no_room_error(out / where.relative_to(tmp), why) from None
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        if out.is_dir() and not out.is_symlink():
            _carry_over(out, tmp)  # a file of the user's in the model folder outlives the new save
            os.replace(out, old)  # the model saved earlier in this run: replaced
        os.replace(tmp, out)
        _remove_partial(old)
        return out

    def _write(self, out: Path, card: dict | None) -> None:
        from gsdistill.retriever.st_format import write_query_document_router, write_sentence_transformer

        out.mkdir(parents=True, exist_ok=True)
        if self.passage_encoder is None:
            write_sentence_transformer(out, self.query_encoder, self.tokenizer, self.pooling, self.normalize,
                                       self.passage_max_length)
        else:
            write_sentence_transformer(out / "query_encoder", self.query_encoder, self.tokenizer, self.pooling,
                                       self.normalize, self.query_max_length)
            write_sentence_transformer(out / "passage_encoder", self.passage_encoder, self.tokenizer, self.pooling,
                                       self.normalize, self.passage_max_length)
            write_query_document_router(out, "query_encoder", "passage_encoder", self.normalize)
        (out / CONFIG_NAME).write_text(json.dumps(self.settings(), indent=2))
        (out / "README.md").write_text(model_card(self.settings(), card or {}))

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides) -> "DualEncoder":
        path = Path(path)
        if not (path / CONFIG_NAME).is_file():
            raise ValueError(f"{path}: not a saved dual encoder (no {CONFIG_NAME})")
        try:
            s = json.loads((path / CONFIG_NAME).read_text(encoding="utf-8"))
            if not isinstance(s, dict):
                raise ValueError(f"a {type(s).__name__}, not an object")
        except ValueError as e:  # JSON and UTF-8 errors name no file
            raise ValueError(f"{path / CONFIG_NAME}: damaged ({type(e).__name__}: {e}); save the model again") from None
        try:
            kwargs = dict(shared=s["shared"], pooling=s["pooling"], normalize=s["normalize"],
                          temperature=s["temperature"], learn_temperature=s["learn_temperature"],
                          query_max_length=s["query_max_length"], passage_max_length=s["passage_max_length"],
                          freeze_passage=s["freeze_passage"], train_top_layers=s.get("train_top_layers", -1))
        except KeyError as e:
            raise ValueError(f"{path / CONFIG_NAME}: no {e} setting; save the model again") from None
        kwargs.update(overrides)
        query_path = path / "query_encoder" if (path / "query_encoder").is_dir() else path  # older saves: subfolder
        model = cls(str(query_path), _passage_path=None if s["shared"] else str(path / "passage_encoder"), **kwargs)
        model.base_name = s["base_model"]
        return model


def freeze_lower_layers(encoder: nn.Module, top: int) -> None:
    """Train only the top ``top`` transformer layers of ``encoder`` (embeddings and the rest frozen)."""
    layers = getattr(getattr(encoder, "encoder", None), "layer", None)
    if layers is None:
        raise ValueError(f"model.train_top_layers: {type(encoder).__name__} has no encoder.layer list")
    if top > len(layers):
        raise ValueError(f"model.train_top_layers={top} but the encoder has {len(layers)} layers")
    encoder.requires_grad_(False)
    for layer in list(layers)[len(layers) - top:]:
        layer.requires_grad_(True)


def model_card(settings: dict, card: dict) -> str:
    lines = ["# Dual-encoder text retriever (gsdistill)", "",
             f"- Base model: `{settings['base_model']}`; towers: {'shared' if settings['shared'] else 'separate'}"
             f"{' (passage tower frozen)' if settings['freeze_passage'] else ''}",
             f"- Pooling: {settings['pooling']}; L2-normalised: {settings['normalize']}; "
             f"temperature: {settings['temperature']:.4g}",
             f"- Max length: query {settings['query_max_length']}, passage {settings['passage_max_length']}"]
    for key in ("data", "loss", "training"):
        if key in card:
            lines.append(f"- {key.capitalize()}: {card[key]}")
    if card.get("metrics"):
        lines += ["", "## Metrics", "", "| measure | value |", "| --- | --- |"]
        lines += [f"| {k} | {v:.4f} |" for k, v in card["metrics"].items()]
    lines += ["", "## Loading", "", "`gsdistill.retriever.model.DualEncoder.from_pretrained(path)`, or with "
              "sentence-transformers:", "", "```python", "from sentence_transformers import SentenceTransformer"]
    if settings["shared"]:
        lines += ["model = SentenceTransformer(path)  # one tower for queries and passages"]
    else:
        lines += ["model = SentenceTransformer(path)  # sentence-transformers >= 5: a Router over both towers",
                  "q = model.encode_query(queries)  # query tower",
                  "d = model.encode_document(passages)  # passage tower (also plain model.encode)",
                  "# any version: SentenceTransformer(path + '/query_encoder'), SentenceTransformer(path + '/passage_encoder')"]
    lines += ["```", ""]
    return "\n".join(lines)


def _carry_over(old: Path, new: Path) -> None:
    """Move every entry of ``old`` that the new save did not write into ``new`` (a link as a link, never
    followed); a sub-folder both hold is merged the same way. What the save wrote wins; the rest (a user's
    notes in the model folder) stays."""
    for entry in old.iterdir():
        target = new / entry.name
        if not target.exists() and not target.is_symlink():
            os.replace(entry, target)
        elif entry.is_dir() and not entry.is_symlink() and target.is_dir() and not target.is_symlink():
            _carry_over(entry, target)


def _remove_partial(folder: Path) -> None:
    """A model folder this process was writing (``.model.tmp-PID`` / ``.model.old-PID``), never a link's target."""
    if folder.is_symlink():
        folder.unlink()
    elif folder.is_dir():
        shutil.rmtree(folder, ignore_errors=True)


def _failed_file(folder: Path, error: Exception) -> Path:
    """The file a failed save into ``folder`` was writing: the weights beside the file written last for a
    safetensors error (transformers removes the partial weights file), else the file written last."""
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    newest = max(files, key=lambda p: p.stat().st_mtime_ns) if files else None
    if type(error).__name__ == "SafetensorError":
        return (newest.parent if newest is not None else folder) / "model.safetensors"
    return newest or folder
