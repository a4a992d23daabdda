"""Box-descriptor formats: exact strings, the format in the text-cache key, geometry kept by the encoder."""
import json

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from gsdistill.config import ConfigError
from gsdistill.tuples.store import text_cache
from gsdistill.tuples.embedding.stage import embed_shards
from gsdistill.tuples.descriptors import (DEFAULT_FORMAT, FORMATS, LEGACY_FORMAT, box_geometry, box_texts,
                                        check_format, pole_words, single_positive_texts)
from gsdistill.tuples.errors import DataError
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.store.writer import write_shards

# 500 x 1000 px page: a Table in the upper right, a full-width Text at the bottom, a Caption.
PAGE = {"id": "p", "width": 500, "height": 1000, "spans": [{"text": "hello"}],
        "boxes": [{"category": "Table", "bbox": [250, 100, 500, 300]},
                  {"category": "Text", "bbox": [0, 900, 500, 1000]},
                  {"category": "Caption", "bbox": [50, 320, 450, 340]}]}


def test_legacy_and_word_formats_exact_strings():
    assert box_texts(PAGE, fmt=LEGACY_FORMAT) == ["Table 500 100 1000 300", "Text 0 900 1000 1000",
                                                  "Caption 100 320 900 340"]
    # Table: centre (750, 200), size 500 x 200 -> right third, top third, middle width third, short
    assert box_texts(PAGE, fmt="cls-words3-v1") == ["Table, top right, medium width, short",
                                                    "Text, bottom center, wide, short",
                                                    "Caption, top center, wide, short"]


def test_poles_format_exact_strings_and_counts():
    # centre x 750 -> round(6.0) = 6 "right"; centre y 200 -> round(1.6) = 2 "bottom";
    # width 500 -> 4 "wide"; height 200 -> round(1.6) = 2 "tall"
    table = box_texts(PAGE, fmt="cls-poles8-v1")[0]
    assert table == ("Table, left left right right right right right right, top top top top top top bottom bottom, "
                     "narrow narrow narrow narrow wide wide wide wide, short short short short short short tall tall")
    assert pole_words(0, "a", "b", 3) == "a a a" and pole_words(1000, "a", "b", 3) == "b b b"
    assert pole_words(1500, "a", "b", 2) == "b b" and pole_words(-5, "a", "b", 2) == "a a"
    nb = box_texts(PAGE, fmt="cls-poles8-nb-v1")
    assert nb[0] == table + "; after start, before Text"
    assert nb[1].endswith("; after Table, before Caption") and nb[2].endswith("; after Text, before end")
    # page context sees every box even when only the first ones are kept
    assert box_texts(PAGE, max_boxes=1, fmt="cls-poles8-nb-v1") == nb[:1]
    assert box_geometry([250, 100, 500, 300], 500, 1000) == (750.0, 200.0, 500.0, 200.0)
    compass = box_texts(PAGE, fmt="cls-compass8-n-v1")
    assert compass[0] == ("Table, west west east east east east east east, north north north north north north south south, "
                          "thin thin thin thin broad broad broad broad, flat flat flat flat flat flat high high; one of 3 boxes")
    assert box_texts(PAGE, fmt="cls-compass8-sig-v1")[1].endswith("; page with 1 Table")
    assert box_texts(PAGE, fmt="cls-compass8-nr-v1")[2].endswith("; box 3 of 3")


def test_format_names_are_checked_and_default_is_registered():
    assert DEFAULT_FORMAT in FORMATS and check_format(None) == DEFAULT_FORMAT
    from gsdistill.config import load_config
    assert load_config("pretrain", None, []).data.descriptor_format == DEFAULT_FORMAT
    assert box_texts(PAGE) == box_texts(PAGE, fmt=DEFAULT_FORMAT)
    with pytest.raises(ValueError, match="unknown descriptor format 'nope'.*cls-xyxy1000-v1"):
        box_texts(PAGE, fmt="nope")
    sem, joint = single_positive_texts(PAGE, LEGACY_FORMAT)
    assert sem == "hello" and joint == "hello Table 500 100 1000 300 Text 0 900 1000 1000 Caption 100 320 900 340"


class _FakeEncoder:
    """Hash of the text -> a unit vector (the cache logic, not the encoder, is under test)."""
    dim = 4

    def __init__(self, *args, **kwargs):
        pass

    def encode(self, texts, batch_size=64):
        rows = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=self.dim) for t in texts]
        return torch.tensor(np.array(rows), dtype=torch.float32).reshape(len(texts), self.dim)


def test_switching_format_rebuilds_cache_and_reader_checks_it(tmp_path):
    from gsdistill.tuples.sources.synthetic import generate_pages
    write_shards(generate_pages(2, seed=3, width=300, height=400), tmp_path)
    meta = tmp_path / "embeddings" / "meta.json"
    embed_shards(tmp_path, _FakeEncoder, "fake", progress=False, descriptor_format=LEGACY_FORMAT)
    legacy = next(iter(read_pages(tmp_path, decode_images=False, embeddings=text_cache.open_embeddings(tmp_path))))["geom_emb"]
    stamp = meta.stat().st_mtime_ns
    embed_shards(tmp_path, _FakeEncoder, "fake", progress=False, descriptor_format=LEGACY_FORMAT)
    assert meta.stat().st_mtime_ns == stamp, "same format: the cache is reused"
    embed_shards(tmp_path, _FakeEncoder, "fake", progress=False, descriptor_format="cls-poles8-v1")
    assert json.loads(meta.read_text())["descriptor_version"] == "cls-poles8-v1"
    page = next(iter(read_pages(tmp_path, decode_images=False, embeddings=text_cache.open_embeddings(tmp_path))))
    expected = _FakeEncoder().encode(box_texts(page, fmt="cls-poles8-v1")).numpy()
    np.testing.assert_allclose(page["geom_emb"], expected)
    assert not np.allclose(page["geom_emb"], legacy)
    with pytest.raises(DataError, match="descriptor format 'cls-poles8-v1'"):
        text_cache.open_embeddings(tmp_path, descriptor_format=LEGACY_FORMAT)
    with pytest.raises(ConfigError, match="descriptor_format: unknown descriptor format 'x-v0'"):
        embed_shards(tmp_path, _FakeEncoder, "fake", progress=False, descriptor_format="x-v0")
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "descriptor_version": "retired-v0"}))
    with pytest.raises(DataError, match="'retired-v0'"):
        text_cache.open_embeddings(tmp_path)


def test_default_format_keeps_geometry_better_than_legacy():
    """Frozen MiniLM on the Table boxes of fixed synthetic pages (descriptors made with their page's
    context): Spearman(cosine, -L1 of centre and size) of the default format beats the legacy one."""
    from gsdistill.tuples.sources.synthetic import generate_pages
    from gsdistill.models.text_encoder import TextEncoder
    torch.set_num_threads(1)
    pages = list(generate_pages(50, seed=11, width=300, height=400))
    texts = {fmt: [] for fmt in (LEGACY_FORMAT, DEFAULT_FORMAT)}
    geometry = []
    for page in pages:
        rows = [i for i, b in enumerate(page["boxes"]) if b["category"] == "Table"]
        geometry += [box_geometry(page["boxes"][i]["bbox"], page["width"], page["height"]) for i in rows]
        for fmt in texts:
            texts[fmt] += [box_texts(page, fmt=fmt)[i] for i in rows]
    assert len(geometry) >= 40
    geometry = np.array(geometry)
    i, j = np.triu_indices(len(geometry), 1)
    closeness = -np.abs(geometry[i] - geometry[j]).sum(1)
    encoder = TextEncoder()
    rho = {}
    for fmt, strings in texts.items():
        emb = encoder.encode(strings).numpy()
        rho[fmt] = spearmanr((emb[i] * emb[j]).sum(1), closeness).statistic
    assert rho[DEFAULT_FORMAT] > 0.5 and rho[DEFAULT_FORMAT] > rho[LEGACY_FORMAT] + 0.2, rho


def test_fourier_features_and_box_encoder():
    from gsdistill.models.box_encoder import BoxEncoder, fourier_features, page_boxes
    feats = fourier_features(torch.tensor([[0.25, 0.5]]), n_freq=2)
    s, c = np.sin, np.cos
    expected = [s(np.pi / 4), s(np.pi / 2), c(np.pi / 4), c(np.pi / 2), s(np.pi / 2), s(np.pi), c(np.pi / 2), c(np.pi)]
    np.testing.assert_allclose(feats.numpy()[0], expected, atol=1e-6)
    ids, geometry = page_boxes(PAGE)
    assert ids.tolist() == [8, 9, 0]  # DocLayNet order: Table, Text, Caption
    np.testing.assert_allclose(geometry[0].numpy(), [0.75, 0.2, 0.5, 0.2])
    torch.manual_seed(0)
    encoder = BoxEncoder(out_dim=16, n_freq=3)
    out = encoder(ids, geometry)
    assert out.shape == (3, 16)
    np.testing.assert_allclose(out.norm(dim=-1).detach().numpy(), 1.0, atol=1e-6)
    out[:, 0].sum().backward()  # a learned target: gradients reach the class table and the MLP
    assert encoder.classes.weight.grad[[8, 9, 0]].abs().sum() > 0 and encoder.classes.weight.grad[1].abs().sum() == 0
    with pytest.raises(ValueError, match="geometry \\[N, 4\\]"):
        encoder(ids, geometry[:, :3])
