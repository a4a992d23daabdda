"""The embedding stage: each distinct text encoded once, streamed shard by shard, fields added on
demand, worker processes, and the fast encode path equal to the plain one (real MiniLM)."""
import json
import zlib

import numpy as np
import pytest
import torch

from gsdistill.tuples.store import text_cache
from gsdistill.tuples.embedding.stage import RecentVectors, embed_pages, embed_shards
from gsdistill.tuples.errors import DataError
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.store.writer import write_shards
from gsdistill.tuples.sources.synthetic import generate_pages


class CountingEncoder:
    """CRC of the text -> a unit vector (the same in every process, unlike ``hash``); counts every
    text it is asked to encode (picklable: worker processes build their own, counting in their process)."""
    dim = 8
    seen: list[str] = []

    def __init__(self, name=None, device="cpu", precision="fp32"):
        self.name = name

    def encode(self, texts, batch_size=64):
        CountingEncoder.seen.extend(texts)
        rows = np.array([np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim) for t in texts])
        return torch.tensor(rows / np.linalg.norm(rows, axis=1, keepdims=True), dtype=torch.float32)


def _with_running_head(pages):
    """Real documents repeat a running head and a page number style on every page."""
    for page in pages:
        page["spans"] = [{"text": "Journal of Tests, vol. 3", "bbox": [10, 5, 200, 15], "category": "Page-header"},
                         *page["spans"], {"text": "Journal of Tests, vol. 3", "bbox": [10, 380, 200, 395],
                                          "category": "Page-footer"}]
        yield page


@pytest.fixture
def shards(tmp_path):
    CountingEncoder.seen = []
    write_shards(_with_running_head(generate_pages(6, seed=2, width=300, height=400)), tmp_path,
                 pages_per_shard=2, progress=False)
    return tmp_path


def _all_texts(folder, fields):
    return [t for p in read_pages(folder, decode_images=False)
            for v in text_cache.page_texts(p, fields=fields).values() for t in ([v] if isinstance(v, str) else v)]


def test_each_distinct_text_is_encoded_once_across_shards(shards):
    fields = text_cache.fields_for("multi")
    report = embed_shards(shards, CountingEncoder, "counting", fields=fields, progress=False)
    texts = _all_texts(shards, fields)
    assert len(set(texts)) < len(texts), "the corpus repeats texts"
    assert sorted(CountingEncoder.seen) == sorted(set(texts)), "every distinct text exactly once, over 3 shards"
    assert (report.pages, report.texts, report.encoded) == (6, len(texts), len(set(texts)))
    assert report.repeat_share == pytest.approx(1 - len(set(texts)) / len(texts))
    # the cached vectors are those of the texts, page by page and in reading order
    cache = text_cache.open_embeddings(shards, required=True)
    for page in read_pages(shards, decode_images=False, embeddings=cache):
        np.testing.assert_allclose(page["sem_emb"], CountingEncoder().encode(text_cache.span_texts(page)).numpy())


def test_a_small_memo_re_encodes_but_writes_the_same_vectors(shards, tmp_path_factory):
    embed_shards(shards, CountingEncoder, "counting", progress=False, fields=("sem",))
    full = {p["id"]: p["sem_emb"] for p in read_pages(shards, decode_images=False,
                                                      embeddings=text_cache.open_embeddings(shards))}
    CountingEncoder.seen = []
    embed_shards(shards, CountingEncoder, "counting", progress=False, fields=("sem",), force=True, memo_texts=1)
    assert CountingEncoder.seen.count("Journal of Tests, vol. 3") == 3, "once per shard when the memo forgets"
    for page in read_pages(shards, decode_images=False, embeddings=text_cache.open_embeddings(shards)):
        np.testing.assert_array_equal(page["sem_emb"], full[page["id"]])


def test_memo_keeps_the_most_recently_used():
    memo = RecentVectors(2)
    memo.put("a", np.zeros(1))
    memo.put("b", np.ones(1))
    assert memo.get("a") is not None  # "a" is now the most recent
    memo.put("c", np.ones(1))
    assert memo.get("b") is None and memo.get("a") is not None and memo.get("c") is not None


def test_whole_page_texts_are_added_on_demand_and_required_by_single_positive_reads(shards):
    meta = shards / "embeddings" / "meta.json"
    embed_shards(shards, CountingEncoder, "counting", progress=False, fields=text_cache.fields_for("multi"))
    with pytest.raises(DataError, match=r"embed .* embed\.positives=single"):
        text_cache.open_embeddings(shards, fields=text_cache.fields_for("single"))
    before = {p["id"]: p["geom_emb"] for p in read_pages(shards, decode_images=False,
                                                         embeddings=text_cache.open_embeddings(shards))}
    CountingEncoder.seen = []
    report = embed_shards(shards, CountingEncoder, "counting", progress=False, fields=text_cache.fields_for("single"))
    whole = set(_all_texts(shards, ("sp_sem", "sp_geom", "sp_joint")))
    assert set(CountingEncoder.seen) == whole and report.encoded == len(whole), "only the missing fields"
    assert json.loads(meta.read_text())["fields"] == list(text_cache.FIELDS)
    cache = text_cache.open_embeddings(shards, fields=text_cache.FIELDS)
    for page in read_pages(shards, decode_images=False, embeddings=cache):
        np.testing.assert_array_equal(page["geom_emb"], before[page["id"]])  # kept, not re-encoded
        assert page["sp_joint_emb"].shape == (CountingEncoder.dim,)


def test_precision_is_part_of_the_cache_key(shards):
    embed_shards(shards, CountingEncoder, "counting", progress=False)
    meta = json.loads((shards / "embeddings" / "meta.json").read_text())
    assert meta["precision"] == "fp32"
    legacy = {k: v for k, v in meta.items() if k != "precision"}  # caches from before the key: fp32
    (shards / "embeddings" / "meta.json").write_text(json.dumps(legacy))
    assert embed_shards(shards, CountingEncoder, "counting", progress=False).reused
    assert not embed_shards(shards, CountingEncoder, "counting", progress=False, precision="bf16").reused


def test_worker_processes_write_the_vectors_of_one_process(shards, tmp_path):
    embed_shards(shards, CountingEncoder, "counting", progress=False)
    one = {p["id"]: p for p in read_pages(shards, decode_images=False, embeddings=text_cache.open_embeddings(shards))}
    embed_shards(shards, CountingEncoder, "counting", progress=False, force=True, workers=2, batch_size=2)
    for page in read_pages(shards, decode_images=False, embeddings=text_cache.open_embeddings(shards)):
        for key in ("sem_emb", "geom_emb", "sp_sem_emb", "sp_joint_emb"):
            np.testing.assert_array_equal(page[key], one[page["id"]][key])
    with pytest.raises(ValueError, match="workers must be >= 1"):
        embed_shards(shards, CountingEncoder, "counting", progress=False, force=True, workers=0)


def test_embed_pages_writes_empty_pages_as_zero_rows():
    page = {"_key": "p", "spans": [], "boxes": [], "width": 10, "height": 10}
    arrays, written, encoded = embed_pages([page], ("sem", "geom"), lambda t: np.zeros((len(t), 4), np.float32),
                                           RecentVectors(8), dim=4)
    assert arrays["p.sem"].shape == (0, 4) and arrays["p.geom"].shape == (0, 4) and (written, encoded) == (0, 0)


def test_shard_reader_takes_a_cache_reader_not_a_flag(shards):
    with pytest.raises(TypeError, match=r"open_embeddings\(path\)"):
        next(iter(read_pages(shards, embeddings=True)))
    assert "sem_emb" not in next(iter(read_pages(shards, decode_images=False)))  # no reader, no vectors


class BrokenEncoder:
    def __init__(self, name=None, device="cpu", precision="fp32"):
        raise ValueError(f"precision must be one of fp32, bf16, got {precision!r}")


def test_an_encoder_that_fails_in_a_worker_fails_the_stage_with_its_error(shards):
    with pytest.raises(ValueError, match="precision must be one of"):
        embed_shards(shards, BrokenEncoder, "broken", progress=False, workers=2, precision="int8")
    assert not (shards / "embeddings" / "meta.json").exists()
