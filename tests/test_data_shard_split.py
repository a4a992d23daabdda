"""Shards split by shard over ranks x workers, readable by WebDataset, resumable without replaying views."""
from __future__ import annotations

import json
import types

import pytest
import torch
from PIL import Image

import gsdistill.tuples.store.reader as shards
from gsdistill.tuples.store.split import batches_before, reader_page_count, reader_parts
from gsdistill.tuples.store.reader import ShardDataset, read_pages
from gsdistill.tuples.store.writer import write_shards


def _page(i: int) -> dict:
    img = Image.new("RGB", (64, 80), (i * 7 % 256, 90, 200))
    return {"id": f"dir.{i % 3}/page {i}", "image": img, "width": 64, "height": 80, "source": "test",
            "doc_id": f"d{i // 4}", "boxes": [{"category": "Text", "bbox": [4, 4, 60, 20]}],
            "spans": [{"text": f"words of page {i}", "bbox": [4, 4, 60, 20], "category": "Text"}]}


@pytest.fixture(scope="module")
def eight_shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("eight")
    write_shards((_page(i) for i in range(8 * 5)), out, pages_per_shard=5, progress=False)
    return out


def test_webdataset_reads_every_page(eight_shards):
    wds = pytest.importorskip("webdataset")
    urls = [str(p) for p in sorted(eight_shards.glob("shard-*.tar"))]
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    ids = [json.loads(s["json"])["id"] for s in samples]
    assert sorted(ids) == sorted(_page(i)["id"] for i in range(40))
    assert all("zst" in s for s in samples)  # the default page storage (image_codec)
    assert {s["__key__"] for s in samples} == {p["_key"] for p in read_pages(eight_shards, decode_images=False)}


class _Counting:
    """A file that adds every byte read from it to ``counter[reader]``."""

    def __init__(self, path, counter: dict, reader: int):
        self.fh, self.counter, self.reader = open(path, "rb"), counter, reader

    def read(self, n=-1):
        data = self.fh.read(n)
        self.counter[self.reader] = self.counter.get(self.reader, 0) + len(data)
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


@pytest.mark.parametrize("shuffle", [0, 8])
def test_two_ranks_two_workers_read_a_quarter_each(eight_shards, monkeypatch, shuffle):
    total = sum(p.stat().st_size for p in eight_shards.glob("shard-*.tar"))
    opened, ids = {}, []
    for rank in range(2):
        for worker in range(2):
            reader = rank * 2 + worker
            monkeypatch.setattr(shards, "get_worker_info", lambda w=worker: types.SimpleNamespace(id=w, num_workers=2))
            monkeypatch.setattr(shards, "_open_shard", lambda path, r=reader: _Counting(path, opened, r))
            ds = ShardDataset(eight_shards, rank=rank, world_size=2, decode_images=False, shuffle_buffer=shuffle, seed=1)
            ids.append([p["id"] for p in ds])
    assert [len(x) for x in ids] == [10, 10, 10, 10]
    for reader in range(4):  # each reader streams its own two shards (tar padding read or not)
        assert 0.22 < opened[reader] / total <= 0.26, (reader, opened[reader] / total)
    flat = [i for x in ids for i in x]
    assert len(flat) == len(set(flat)) and set(flat) == {_page(i)["id"] for i in range(40)}


def test_real_dataloader_workers_partition_the_pages(eight_shards):
    seen = []
    for rank in range(2):
        loader = torch.utils.data.DataLoader(ShardDataset(eight_shards, rank=rank, world_size=2, decode_images=False),
                                             batch_size=None, num_workers=2, collate_fn=lambda p: p["id"])
        seen += list(loader)
    assert sorted(seen) == sorted(_page(i)["id"] for i in range(40))


def test_uneven_shards_neither_drop_nor_repeat_pages():
    pages = [7] * 10 + [3]  # 11 shards, the last one short, over 4 readers
    order = [3, 10, 0, 7, 1, 9, 2, 8, 4, 6, 5]
    parts = [reader_parts(order, pages, r, 4) for r in range(4)]
    seen = {}
    for ps in parts:
        assert len(ps) <= 4  # its ~2.6 shards' worth, plus the shards its run starts or ends inside
        for p in ps:
            for page in range(p.start, p.stop):
                seen[(p.shard, page)] = seen.get((p.shard, page), 0) + 1
    assert set(seen) == {(s, i) for s in range(11) for i in range(pages[s])} and set(seen.values()) == {1}
    counts = [sum(p.pages for p in ps) for ps in parts]
    assert counts == [18, 18, 18, 19] and counts == [reader_page_count(order, pages, r, 4) for r in range(4)]


def test_fewer_shards_than_readers_falls_back_to_pages_with_warning(tmp_path):
    write_shards((_page(i) for i in range(9)), tmp_path, pages_per_shard=5, progress=False)  # 2 shards
    ids = []
    with pytest.warns(UserWarning, match="2 shards for 3 readers"):
        for rank in range(3):
            ids += [p["id"] for p in ShardDataset(tmp_path, rank=rank, world_size=3, decode_images=False)]
    assert sorted(ids) == sorted(_page(i)["id"] for i in range(9))


def test_batches_before_follows_the_dataloader_round_robin():
    assert batches_before(5, [3, 1, 2]) == ([2, 1, 2], 0)  # next: worker 0's third batch
    assert batches_before(4, [3, 1, 2]) == ([2, 1, 1], 2)
    assert batches_before(2, [3, 0, 2]) == ([1, 0, 1], 0)
    assert batches_before(9, [2, 2]) == ([2, 2], 0)


class _CountingViews:
    """Transform that records every page it augments (module level: picklable for workers)."""
    calls: list = []

    def __call__(self, page):
        _CountingViews.calls.append(page["id"])
        return page["id"]


@pytest.mark.parametrize("workers", [0, 2, 3])  # 3: uneven pages per worker
def test_skip_batches_resumes_the_dataloader_exactly(eight_shards, workers):
    def loader(ds):
        return torch.utils.data.DataLoader(ds, batch_size=3, num_workers=workers, drop_last=True,
                                           collate_fn=list)
    full = list(loader(ShardDataset(eight_shards, shuffle_buffer=6, seed=2, decode_images=False)))
    for k in (0, 3, len(full) - 1, len(full)):
        ds = ShardDataset(eight_shards, shuffle_buffer=6, seed=2, decode_images=False)
        ds.skip_batches(k, 3)
        assert list(loader(ds)) == full[k:], k


def test_skipped_pages_are_not_augmented(eight_shards):
    _CountingViews.calls = []
    ds = ShardDataset(eight_shards, shuffle_buffer=4, seed=0, decode_images=False, transform=_CountingViews())
    ds.skip_batches(4, 5)
    rest = list(ds)
    assert len(rest) == 20 and _CountingViews.calls == rest
