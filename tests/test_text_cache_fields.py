"""The text cache embeds only the fields the objective reads (the long whole-page texts on demand)."""
import json

import numpy as np
import pytest
import torch

from gsdistill.tuples.store import text_cache
from gsdistill.tuples.embedding.stage import embed_shards
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.store.writer import write_shards
from gsdistill.tuples.sources.synthetic import generate_pages


class _CountingEncoder:
    """Hash of the text -> a unit vector; records every text it was asked to encode."""
    dim = 4
    seen: list[str] = []

    def __init__(self, *args, **kwargs):
        pass

    def encode(self, texts, batch_size=64):
        _CountingEncoder.seen.extend(texts)
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=self.dim) for t in texts]
        return torch.tensor(np.array(rows), dtype=torch.float32).reshape(len(texts), self.dim)


@pytest.fixture
def shards(tmp_path):
    _CountingEncoder.seen = []
    write_shards(generate_pages(3, seed=1, width=300, height=400), tmp_path)
    return tmp_path


def test_fields_for_each_objective():
    assert text_cache.fields_for("multi") == ("sem", "geom")
    assert text_cache.fields_for("single") == text_cache.FIELDS


def test_multi_positive_cache_skips_whole_page_texts_and_a_full_cache_serves_it(shards):
    meta = shards / "embeddings" / "meta.json"
    embed_shards(shards, _CountingEncoder, "fake", progress=False, fields=text_cache.fields_for("multi"))
    page = next(iter(read_pages(shards, decode_images=False, embeddings=text_cache.open_embeddings(shards))))
    assert {"sem_emb", "geom_emb"} <= set(page) and not any(k.startswith("sp_") for k in page)
    texts = text_cache.page_texts(page)
    assert texts["sp_joint"] not in _CountingEncoder.seen and texts["sp_sem"] not in _CountingEncoder.seen
    assert json.loads(meta.read_text())["fields"] == ["sem", "geom"]
    # the single-positive rows need the whole-page texts: the partial cache is not current for them
    embed_shards(shards, _CountingEncoder, "fake", progress=False, fields=text_cache.fields_for("single"))
    assert texts["sp_joint"] in _CountingEncoder.seen
    page = next(iter(read_pages(shards, decode_images=False, embeddings=text_cache.open_embeddings(shards))))
    assert {"sp_sem_emb", "sp_geom_emb", "sp_joint_emb"} <= set(page)
    # a full cache holds what the multi-positive objective reads: reused, nothing re-encoded
    stamp, count = meta.stat().st_mtime_ns, len(_CountingEncoder.seen)
    embed_shards(shards, _CountingEncoder, "fake", progress=False, fields=text_cache.fields_for("multi"))
    assert meta.stat().st_mtime_ns == stamp and len(_CountingEncoder.seen) == count


def test_a_cache_without_the_fields_key_holds_every_field():
    assert text_cache.cached_fields({"format": text_cache.FORMAT}) == text_cache.FIELDS
