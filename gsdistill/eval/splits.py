"""Held-out splits by document: no source document has pages on both sides.

Pages of one PDF share layout, fonts, running headers and vocabulary; a page-level split would let
the retrieval evaluation score pages whose siblings were seen in pretraining (paper 003 §6.2 uses
pages "not included in the pretraining dataset"). The split therefore assigns whole documents
(``page["doc_id"]``): a seeded shuffle of the sorted document ids, the first ``eval_fraction`` of
them (at least one, at most all but one) held out. Documents that share a page's image or text
(the same PDF under two names) are grouped and kept on one side (:func:`document_groups`).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np

from gsdistill.errors import InputError


def split_documents(doc_ids: Iterable[str], eval_fraction: float, seed: int = 0
                    ) -> tuple[list[str], list[str]]:
    """(pretraining docs, held-out docs), both sorted; deterministic for a seed."""
    docs = sorted(set(map(str, doc_ids)))
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    if len(docs) < 2:
        raise ValueError(f"a document-level split needs at least 2 documents, got {len(docs)}")
    order = np.random.default_rng(seed).permutation(len(docs))
    n_eval = min(max(1, round(eval_fraction * len(docs))), len(docs) - 1)
    held = {docs[i] for i in order[:n_eval]}
    return [d for d in docs if d not in held], sorted(held)


def page_doc_id(page: dict) -> str:
    """The page's source document; a page without one is its own document."""
    return str(page.get("doc_id") or page["id"])


def document_ids(shard_dir: str | Path) -> set[str]:
    """Every document id in a shard folder (images are never decoded)."""
    from gsdistill.tuples.store.reader import ShardDataset
    return {page_doc_id(p) for p in ShardDataset(shard_dir, decode_images=False)}


def check_held_out(eval_doc_ids: Iterable[str], pretrain_doc_ids: Iterable[str], what: str = "") -> None:
    """Raise ValueError naming the shared documents when the evaluation pages are not held out."""
    shared = sorted(set(map(str, eval_doc_ids)) & set(map(str, pretrain_doc_ids)))
    if shared:
        listed = ", ".join(shared[:5]) + (f" and {len(shared) - 5} more" if len(shared) > 5 else "")
        raise ValueError(f"{what or 'evaluation pages'}: {len(shared)} document(s) also in the "
                         f"pretraining data ({listed}); split by document first (gsdistill eval split)")


MIN_TEXT_CHARS = 50  # a page with less text (a blank page, a page number) is not recognised by its text


def page_fingerprints(page: dict) -> list[str]:
    """Content keys of a page, so that it is recognised under another document name (a renamed copy
    of a PDF): the hash of its image bytes (unless nothing on it is labelled: blank pages look alike)
    and of its text (when it has at least ``MIN_TEXT_CHARS`` letters)."""
    keys = []
    if page.get("spans") or page.get("boxes"):
        image = page["image"] if isinstance(page["image"], bytes) else b""
        if image:
            keys.append("image:" + hashlib.sha256(image).hexdigest())
    text = " ".join(" ".join(str(s.get("text") or "") for s in page.get("spans") or []).split())
    if sum(not c.isspace() for c in text) >= MIN_TEXT_CHARS:
        keys.append("text:" + hashlib.sha256(text.encode("utf-8")).hexdigest())
    return keys


def content_index(shard_dir: str | Path) -> tuple[set[str], dict[str, str]]:
    """(document ids, content key -> ``doc_id/page id``) of a shard folder, in one pass (images are
    read as bytes, never decoded)."""
    from gsdistill.tuples.store.reader import ShardDataset
    docs, keys = set(), {}
    for page in ShardDataset(shard_dir, decode_images=False):
        doc = page_doc_id(page)
        docs.add(doc)
        for key in page_fingerprints(page):
            keys.setdefault(key, f"{doc}/{page['id']}")
    return docs, keys


def check_held_out_pages(eval_index: tuple[set[str], dict[str, str]], pretrain_dir: str | Path, what: str) -> None:
    """ValueError when evaluation pages share a document name, or a page's image or text, with the
    pretraining pages of ``pretrain_dir`` (``eval_index``: :func:`content_index` of the evaluation pages)."""
    train_docs, train_keys = content_index(pretrain_dir)
    check_held_out(eval_index[0], train_docs, what)
    same = sorted((page, train_keys[key]) for key, page in eval_index[1].items() if key in train_keys)
    if same:
        pairs = sorted({f"{a} = {b}" for a, b in same})
        listed = ", ".join(pairs[:3]) + (f" and {len(pairs) - 3} more" if len(pairs) > 3 else "")
        raise ValueError(f"{what}: {len(pairs)} evaluation page(s) have the same image or text as pretraining "
                         f"pages under another document name ({listed}): a renamed copy of a pretraining "
                         "document? Remove it from the evaluation pages (--allow-overlap skips this check)")


def document_groups(shard_dir: str | Path) -> list[list[str]]:
    """Every document of a shard folder in a group with the documents it shares a page's image or
    text with (:func:`page_fingerprints`: a copy under another name), groups and members sorted; one
    pass, images read as bytes, never decoded."""
    from gsdistill.tuples.store.reader import ShardDataset
    parent: dict[str, str] = {}

    def root(doc: str) -> str:
        while parent[doc] != doc:
            parent[doc] = parent[parent[doc]]
            doc = parent[doc]
        return doc

    first: dict[str, str] = {}
    for page in ShardDataset(shard_dir, decode_images=False):
        doc = page_doc_id(page)
        parent.setdefault(doc, doc)
        for key in page_fingerprints(page):
            other = first.setdefault(key, doc)
            a, b = sorted((root(doc), root(other)))
            parent[b] = a
    groups: dict[str, list[str]] = {}
    for doc in parent:
        groups.setdefault(root(doc), []).append(doc)
    return sorted(sorted(g) for g in groups.values())


def split_groups(groups: list[list[str]], eval_fraction: float, seed: int = 0) -> tuple[list[str], list[str]]:
    """(pretraining docs, held-out docs) with each group on one side: :func:`split_documents` over the
    groups (each named by its first document), so without copies it is the plain document split."""
    if len(groups) < 2 <= sum(map(len, groups)):
        raise InputError(f"a document-level split needs at least 2 documents with different pages; all "
                         f"{sum(map(len, groups))} documents share pages (copies of one document)")
    by_name = {g[0]: g for g in groups}
    train, held = split_documents(by_name, eval_fraction, seed)
    return sorted(d for name in train for d in by_name[name]), sorted(d for name in held for d in by_name[name])


def _claim(folder: Path, role: str, option: str, source: Path, overwrite: bool) -> bool:
    """Whether ``folder`` may take this side of the split (checked for both sides before either is
    written): new or empty, the same side of an earlier split of ``source`` (run again), or
    ``overwrite``; another output is refused, and so is a folder holding files gsdistill did not write
    (unless ``overwrite``: they stay as they are); a name the split writes that is the user's
    (``manifest.json``, a ``shard-*.tar``) is refused always. True when what gsdistill wrote there
    must be removed first."""
    from gsdistill.output_folder import check_claim
    from gsdistill.tuples.store.folder import SPLIT, holds_shards, refuse, split_record_of
    check_claim(folder, option, SPLIT, overwrite, fresh=False)
    if overwrite:
        return True
    if not holds_shards(folder):
        check_claim(folder, option, SPLIT, overwrite)
        return False
    rec = split_record_of(folder) or {}
    real = os.path.realpath
    if rec.get("source") and real(rec["source"]) == real(source) and real(rec.get(f"{role}_dir", "")) == real(folder):
        return False  # this command's own output: written again
    raise refuse(folder, option, f"not the {role} side of a split of {source}")


def split_shards(shard_dir: str | Path, train_dir: str | Path, eval_dir: str | Path,
                 eval_fraction: float = 0.1, seed: int = 0, pages_per_shard: int = 256,
                 overwrite: bool = False) -> dict:
    """Copy a shard folder into a pretraining part and a held-out part, split by document.

    Both outputs are checked (not a file, not the input, not inside or around it or each other; not
    holding another output, unless ``overwrite``: then what gsdistill wrote there is removed first)
    and locked before anything is written. Documents sharing a page's image or text (a copy under
    another name) are kept on one side (``grouped`` in the record). Two passes over the input
    (documents and their page contents, then pages); both outputs get their own manifest, and
    ``split.json`` in each records the seed, fraction, both document lists and the groups.
    """
    from gsdistill.output_folder import check_output_dir, lock_folder, remove_earlier
    from gsdistill.tuples.store.folder import SHARD_FOLDER, removed_if_left_empty
    from gsdistill.tuples.store.reader import ShardDataset, read_manifest
    from gsdistill.tuples.store.writer import write_shards
    source = Path(shard_dir)
    outs = {"train": Path(train_dir), "eval": Path(eval_dir)}
    options = {"train": "--train-out", "eval": "--eval-out"}
    for role, other in (("train", "eval"), ("eval", "train")):
        check_output_dir(outs[role], options[role], inputs=[("SHARD_DIR", source)],
                         outputs=[(options[other], outs[other])])
    read_manifest(source)  # a shard folder, before the locks create the outputs
    with removed_if_left_empty(*outs.values()), lock_folder(outs["train"]), lock_folder(outs["eval"]):
        to_clear = [role for role in outs if _claim(outs[role], role, options[role], source, overwrite)]
        for role in to_clear:
            remove_earlier(outs[role], SHARD_FOLDER)
        groups = document_groups(source)
        train_docs, eval_docs = split_groups(groups, eval_fraction, seed)
        held = set(eval_docs)

        def side(keep_held: bool):
            for page in ShardDataset(source):
                if (page_doc_id(page) in held) == keep_held:
                    yield page

        train_manifest = write_shards(side(False), outs["train"], pages_per_shard=pages_per_shard)
        eval_manifest = write_shards(side(True), outs["eval"], pages_per_shard=pages_per_shard)
        record = {"source": str(shard_dir), "seed": seed, "eval_fraction": eval_fraction,
                  "train_dir": str(train_dir), "eval_dir": str(eval_dir),
                  "train_docs": train_docs, "eval_docs": eval_docs,
                  "grouped": [g for g in groups if len(g) > 1],
                  "train_pages": _count(train_manifest), "eval_pages": _count(eval_manifest)}
        for out in outs.values():
            (out / "split.json").write_text(json.dumps(record, indent=2))
    return record


def _count(manifest: dict) -> int | None:
    for key in ("n_pages", "pages", "num_pages", "count"):
        if isinstance(manifest.get(key), int):
            return manifest[key]
    return None
