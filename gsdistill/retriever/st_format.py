"""Write a Hugging Face encoder as a complete sentence-transformers model folder.

Layout (what ``SentenceTransformer(folder)`` reads): the encoder's ``config.json`` +
``model.safetensors`` + tokenizer files at the top, ``modules.json`` listing
Transformer -> Pooling (``1_Pooling/config.json``) -> Normalize (``2_Normalize``, when the project
L2-normalises), ``sentence_bert_config.json`` (``max_seq_length``) and
``config_sentence_transformers.json`` (similarity function). Written by hand, so saving needs no
sentence-transformers install; ``AutoModel.from_pretrained(folder)`` opens the same folder.
"""
from __future__ import annotations

import json
from pathlib import Path

from torch import nn


def write_sentence_transformer(folder: str | Path, encoder: nn.Module, tokenizer, pooling: str, normalize: bool,
                               max_seq_length: int) -> Path:
    """Save ``encoder`` (an ``AutoModel``) and ``tokenizer`` in ``folder`` as a sentence-transformers model."""
    if pooling not in ("mean", "cls"):
        raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(out)
    tokenizer.save_pretrained(out)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir(exist_ok=True)
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": int(max_seq_length),
                                                               "do_lower_case": False}, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": int(encoder.config.hidden_size),
        "pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}, indent=2))
    (out / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
        "similarity_fn_name": "cosine" if normalize else "dot"}, indent=2))
    return out
