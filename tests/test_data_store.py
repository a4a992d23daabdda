"""Shards, the text-embedding cache, multi-crop views and iBOT masks (the data core)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from gsdistill.tuples.store import text_cache
from gsdistill.tuples.embedding.stage import embed_shards
from gsdistill.tuples.errors import DataError, SkipLog
from gsdistill.views.masking import block_mask, view_mask
from gsdistill.tuples.store.reader import ShardDataset, read_manifest, read_pages
from gsdistill.tuples.store.writer import write_shards
from gsdistill.views.multicrop import MultiCropViews, collate_pretrain


def _page(i: int, spans: int = 2) -> dict:
    img = Image.new("RGB", (200, 240), "white")
    img.paste((200, 0, 0), (40, 60, 120, 140))  # a red "Picture" box
    return {"id": f"doc.{i // 2}/p{i}", "image": img, "width": 200, "height": 240, "source": "test",
            "doc_id": f"doc{i // 2}", "boxes": [{"category": "Picture", "bbox": [40, 60, 120, 140]}],
            "spans": [{"text": f"span {j} of page {i}", "bbox": [10, 10 + 20 * j, 190, 28 + 20 * j],
                       "category": "Text"} for j in range(spans)]}


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    skips = SkipLog()
    skips.add("broken.pdf", "corrupt: cannot open")
    pages = [_page(i) for i in range(7)] + [_page(99, spans=0)]
    manifest = write_shards(pages, out, pages_per_shard=3, skips=skips, progress=False)
    assert manifest["pages"] == 7
    return out


def test_round_trip_and_manifest(shard_dir):
    manifest = read_manifest(shard_dir)
    assert [s["pages"] for s in manifest["shards"]] == [3, 3, 1]
    assert manifest["boxes_per_class"] == {"Picture": 7} and manifest["documents"] == 4
    reasons = {s["source"]: s["reason"] for s in manifest["skipped"]}
    assert reasons == {"broken.pdf": "corrupt: cannot open", "doc.49/p99": "no text: page has no spans"}
    assert manifest["skipped_count"] == 2
    pages = list(read_pages(shard_dir))
    assert [p["id"] for p in pages] == [f"doc.{i // 2}/p{i}" for i in range(7)]
    original = _page(3)
    assert pages[3]["spans"] == original["spans"] and pages[3]["boxes"] == original["boxes"]
    assert np.array_equal(np.asarray(pages[3]["image"].convert("RGB")), np.asarray(original["image"]))


def test_png_images_decode_lazily_and_zst_images_at_once(shard_dir, tmp_path):
    """A PNG page is decoded on first use (its header only until then); a zst page (the default storage)
    is decoded at once, its frame checksum checked, in a fraction of PNG's decode time (image_codec)."""
    write_shards([_page(i) for i in range(2)], tmp_path / "png", image_format="png", progress=False)
    page = next(iter(read_pages(tmp_path / "png")))
    assert page["image"]._im is None  # only the header is read until pixels are used
    assert page["image"].size == (200, 240) and page["image"]._im is None
    assert page["image"].convert("RGB").getpixel((50, 70)) == (200, 0, 0)
    page = next(iter(read_pages(shard_dir)))
    assert page["image"].size == (200, 240) and page["image"].getpixel((50, 70)) == (200, 0, 0)


def test_rank_and_worker_split_is_a_partition(shard_dir):
    seen = []
    for rank in range(2):
        ids = [p["id"] for p in ShardDataset(shard_dir, rank=rank, world_size=2, decode_images=False)]
        seen.append(ids)
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(p["id"] for p in read_pages(shard_dir, decode_images=False))
    loader = torch.utils.data.DataLoader(ShardDataset(shard_dir, decode_images=False), batch_size=None,
                                         num_workers=2, collate_fn=lambda p: p["id"])
    assert sorted(loader) == sorted(seen[0] + seen[1])


def test_shuffle_is_seeded_and_resume_continues(shard_dir):
    a = [p["id"] for p in ShardDataset(shard_dir, shuffle_buffer=4, seed=3, decode_images=False)]
    b = [p["id"] for p in ShardDataset(shard_dir, shuffle_buffer=4, seed=3, decode_images=False)]
    c = [p["id"] for p in ShardDataset(shard_dir, shuffle_buffer=4, seed=4, decode_images=False)]
    assert a == b and sorted(a) == sorted(c) and a != [p["id"] for p in read_pages(shard_dir)]
    ds = ShardDataset(shard_dir, shuffle_buffer=4, seed=3, decode_images=False)
    it = iter(ds)
    first = [next(it)["id"] for _ in range(3)]
    state = ds.state_dict()
    resumed = ShardDataset(shard_dir, shuffle_buffer=4, seed=3, decode_images=False)
    resumed.load_state_dict(state)
    assert first + [p["id"] for p in resumed] == a


class _FakeEncoder:
    """Deterministic stand-in with the TextEncoder interface (hash of the text -> unit vector)."""
    dim = 8

    def __init__(self, *args, **kwargs):
        pass

    def encode(self, texts, batch_size=64):
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=self.dim) for t in texts]
        return torch.tensor(np.array(rows), dtype=torch.float32).reshape(len(texts), self.dim)


def test_text_cache_reuse_and_rebuild_on_version_change(shard_dir):
    embed_shards(shard_dir, _FakeEncoder, "fake", progress=False)
    page = next(iter(read_pages(shard_dir, embeddings=text_cache.open_embeddings(shard_dir))))
    assert page["sem_emb"].shape == (2, 8) and page["geom_emb"].shape == (1, 8)
    assert page["sp_sem_emb"].shape == (8,) and page["sp_joint_emb"].shape == (8,)
    expected = _FakeEncoder().encode(["span 1 of page 0"]).numpy()[0]
    np.testing.assert_allclose(page["sem_emb"][1], expected)
    meta_path = shard_dir / "embeddings" / "meta.json"
    stamp = meta_path.stat().st_mtime_ns
    embed_shards(shard_dir, _FakeEncoder, "fake", progress=False)
    assert meta_path.stat().st_mtime_ns == stamp, "a current cache is reused"
    with pytest.raises(DataError, match="descriptor format"):
        text_cache.open_embeddings(shard_dir, descriptor_format="cls-xyxy1000-v1")
    embed_shards(shard_dir, _FakeEncoder, "fake", progress=False, descriptor_format="cls-xyxy1000-v1")
    assert json.loads(meta_path.read_text())["descriptor_version"] == "cls-xyxy1000-v1"
    with pytest.raises(DataError, match="made with 'fake'"):
        text_cache.open_embeddings(shard_dir, encoder="all-MiniLM-L6-v2")


def test_views_keep_boxes_on_their_pixels():
    page = _page(0)
    views = MultiCropViews(global_size=64, local_size=32, n_global=2, n_local=3, global_scale=(0.5, 1.0),
                           local_scale=(0.3, 0.6), patch_size=16, color_jitter=0, blur_prob=0, seed=1,
                           track_boxes=True)
    checked = 0
    for _ in range(5):
        sample = views(page)
        for crop, boxes in zip(sample["global_crops"] + sample["local_crops"],
                               sample["global_boxes"] + sample["local_boxes"]):
            assert crop.dtype == torch.uint8  # pixels; the model normalises them on its device
            rgb = crop.float() / 255.0
            for (x0, y0, x1, y1), label in zip(boxes["bboxes"], boxes["labels"]):
                if label != "box:0" or x1 - x0 < 4 or y1 - y0 < 4:
                    continue
                inner = rgb[:, int(y0) + 1:int(y1) - 1, int(x0) + 1:int(x1) - 1]
                assert inner[0].mean() > 0.6 and inner[1].mean() < 0.2, "box moved off the red picture"
                checked += 1
    assert checked >= 5


def test_views_are_seeded_and_masks_match_ratio():
    a, b = MultiCropViews(global_size=64, local_size=32, n_local=1, seed=5), MultiCropViews(
        global_size=64, local_size=32, n_local=1, seed=5)
    sa, sb = a(_page(1)), b(_page(1))
    assert all(torch.equal(x, y) for x, y in zip(sa["global_crops"], sb["global_crops"]))
    rng = np.random.default_rng(0)
    m = block_mask(14, 14, 60, rng)
    assert m.shape == (14, 14) and m.sum() == 60
    masks = [view_mask((14, 14), 0.5, (0.1, 0.5), rng) for _ in range(200)]
    masked = [x.mean() for x in masks if x.any()]
    assert 60 < len(masked) < 140 and all(0.09 <= r <= 0.51 for r in masked)


def test_collate_is_view_major_and_padded(shard_dir):
    embed_shards(shard_dir, _FakeEncoder, "fake", progress=False)
    views = MultiCropViews(global_size=32, local_size=16, n_global=2, n_local=0, patch_size=16)
    samples = [views(p) for p in list(read_pages(shard_dir, embeddings=text_cache.open_embeddings(shard_dir)))[:3]]
    batch = collate_pretrain(samples)
    assert batch["global_crops"].shape == (6, 3, 32, 32) and batch["local_crops"].shape == (0, 3, 32, 32)
    assert torch.equal(batch["global_crops"][1], samples[1]["global_crops"][0])
    assert torch.equal(batch["global_crops"][3], samples[0]["global_crops"][1])
    assert batch["masks"].shape == (6, 4) and batch["sem_valid"].sum(1).tolist() == [2, 2, 2]
    with pytest.raises(ValueError, match="tuples embed"):
        collate_pretrain([{k: v for k, v in samples[0].items() if k != "sem_emb"}])
