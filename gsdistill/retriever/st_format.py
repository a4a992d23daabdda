"""Write a Hugging Face encoder as a complete sentence-transformers model folder.

Layout (what ``SentenceTransformer(folder)`` reads): the encoder's ``config.json`` +
``model.safetensors`` + tokenizer files at the top, ``modules.json`` listing
Transformer -> Pooling (``1_Pooling/config.json``) -> Normalize (``2_Normalize``, when the project
L2-normalises), ``sentence_bert_config.json`` (``max_seq_length``) and
``config_sentence_transformers.json`` (similarity function). Written by hand, so saving needs no
sentence-transformers install; ``AutoModel.from_pretrained(folder)`` opens the same folder.

Separate towers: each is such a folder (``query_encoder/``, ``passage_encoder/``), and
``write_query_document_router`` makes their parent a sentence-transformers >= 5 ``Router`` model
over them (no weights copied), so ``SentenceTransformer(parent)`` opens the pair and routes
``encode_query`` to the query tower and ``encode_document`` (and plain ``encode``) to the passage tower.
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


def write_query_document_router(folder: str | Path, query_dir: str, document_dir: str, normalize: bool) -> Path:
    """``folder/modules.json`` + ``router_config.json``: a Router whose "query" route is the modules of
    ``folder/query_dir`` and whose "document" route (the default) those of ``folder/document_dir``, in
    the layout ``Router.save`` writes, with module ids that are the towers' own subfolders."""
    out = Path(folder)
    types, structure = {}, {}
    for route, sub in (("query", query_dir), ("document", document_dir)):
        ids = [sub, f"{sub}/1_Pooling"] + ([f"{sub}/2_Normalize"] if normalize else [])
        kinds = ["Transformer", "Pooling", "Normalize"][:len(ids)]
        types.update({i: f"sentence_transformers.models.{k}" for i, k in zip(ids, kinds)})
        structure[route] = ids
    (out / "router_config.json").write_text(json.dumps({
        "types": types, "structure": structure,
        "parameters": {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}}, indent=2))
    (out / "modules.json").write_text(json.dumps(
        [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Router"}], indent=2))
    (out / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None,
        "similarity_fn_name": "cosine" if normalize else "dot"}, indent=2))
    return out
