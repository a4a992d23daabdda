"""Crop-subsampled page retrieval: scoring formulas, sampling, gallery choice, metrics vs brute force."""
from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from gsdistill.config import ConfigError, load_config
from gsdistill.eval import page_retrieval as pr

D = 16


def _vec(text: str) -> np.ndarray:
    seed = int(hashlib.sha1(text.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).standard_normal(D)


class FakeTextEncoder:
    """A text's vector is seeded by its hash; a multi-line text sums its lines' vectors."""

    def __init__(self):
        self.calls = 0

    def encode(self, texts, batch_size=64):
        self.calls += len(texts)
        return torch.tensor(np.stack([sum(_vec(line) for line in t.split("\n")) for t in texts]),
                            dtype=torch.float32)


class FakeModel(torch.nn.Module):
    """Page i is a solid image with red value i; its embedding is row i of a fixed table."""

    def __init__(self, page_table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", page_table)

    def embed_pages(self, images):
        red = images[:, 0].mean((1, 2)) * 0.229 + 0.485  # undo ImageNet normalisation
        return F.normalize(self.table[(red * 255).round().long()], dim=-1)

    def embed_text_sem(self, text_emb):
        return F.normalize(text_emb, dim=-1)


def _pages(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    pages = []
    for i in range(n):
        spans = [{"text": f"page {i} span {j} {rng.random():.6f}", "bbox": [0, 0, 1, 1]}
                 for j in range(rng.randint(1, 10))]
        pages.append({"id": f"p{i:03d}", "doc_id": f"d{i // 4}", "image": Image.new("RGB", (20, 30), (i, 0, 0)),
                      "width": 20, "height": 30, "spans": spans, "boxes": []})
    return pages


def _model_for(pages: list[dict], noise: float = 1.0) -> FakeModel:
    # page embedding = mean of its span vectors + noise, so crops are informative but imperfect
    rng = np.random.default_rng(1)
    rows = [np.mean([_vec(s["text"]) for s in p["spans"]], 0) + noise * rng.standard_normal(D) for p in pages]
    rows += [rng.standard_normal(D)] * (256 - len(rows))
    return FakeModel(torch.tensor(np.stack(rows), dtype=torch.float32))


def _cfg(**kw):
    """The eval config through the one loader, with ``retrieval.<key>=<value>`` for each setting."""
    base = {"n_gallery": 1000, "ks": [1, 3, 8], "seeds": [0, 1], "device": "cpu", "image_size": 8,
            "run_depth": 100, "sp_separator": "\n"}  # the fake encoder sums the lines of a text
    base.update(kw)
    return load_config("eval", None, [f"retrieval.{k}={json.dumps(v)}" for k, v in base.items()])


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _brute_force(pages, model, k, seed, scoring, aggregation="lse", temperature=0.05):
    """Acc@1, R@5, R@10, MRR by explicit loops over queries, crops and pages."""
    ids = sorted(p["id"] for p in pages)
    by_id = {p["id"]: p for p in pages}
    gal = _unit(model.table[: len(pages)].numpy().astype(np.float64))
    gal = gal[[int(i[1:]) for i in ids]]
    picks = pr.sample_crops([len(by_id[i]["spans"]) for i in ids], k, seed)
    ranks = []
    for q, pid in enumerate(ids):
        crops = [by_id[pid]["spans"][j]["text"] for j in picks[q]]
        if scoring == "single_positive":
            scores = gal @ _unit(sum(_vec(t) for t in crops))
        else:
            sims = np.array([[_unit(_vec(t)) @ g for g in gal] for t in crops])  # [k, N]
            if aggregation == "lse":
                scores = temperature * np.log(np.exp(sims / temperature).sum(0))
            else:
                scores = sims.mean(0) if aggregation == "mean" else sims.max(0)
        ranks.append(1 + int((scores > scores[q]).sum()))
    ranks = np.array(ranks)
    return {"Acc@1": np.mean(ranks == 1), "R@5": np.mean(ranks <= 5), "R@10": np.mean(ranks <= 10),
            "MRR": np.mean(np.where(ranks <= 100, 1.0 / ranks, 0.0))}


def test_aggregation_formulas_with_padding():
    g = torch.Generator().manual_seed(0)
    sims = torch.rand(3, 4, 5, generator=g) * 2 - 1
    valid = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    t = 0.1
    lse = pr.aggregate_crop_scores(sims, valid, "lse", t)
    for q in range(3):
        s = sims[q][valid[q]].double().numpy()
        np.testing.assert_allclose(lse[q].numpy(), t * np.log(np.exp(s / t).sum(0)), rtol=1e-5)
        np.testing.assert_allclose(pr.aggregate_crop_scores(sims, valid, "mean")[q].numpy(), s.mean(0), rtol=1e-5)
        np.testing.assert_allclose(pr.aggregate_crop_scores(sims, valid, "max")[q].numpy(), s.max(0), rtol=1e-6)
    # a tiny temperature tends to max; one crop makes every aggregation the crop's own cosine
    np.testing.assert_allclose(pr.aggregate_crop_scores(sims, valid, "lse", 1e-4).numpy(),
                               pr.aggregate_crop_scores(sims, valid, "max").numpy(), atol=2e-4)
    for agg in pr.AGGREGATIONS:
        np.testing.assert_allclose(pr.aggregate_crop_scores(sims, valid, agg, t)[1].numpy(), sims[1, 0].numpy(),
                                   atol=1e-6)
    with pytest.raises(ValueError, match="unknown aggregation 'sum'"):
        pr.aggregate_crop_scores(sims, valid, "sum")
    with pytest.raises(ValueError, match="at least one valid crop"):
        pr.aggregate_crop_scores(sims, torch.zeros(3, 4, dtype=torch.bool))


def test_sample_crops_seeded_sorted_distinct():
    n = [1, 3, 8, 20]
    a, b = pr.sample_crops(n, 5, 7), pr.sample_crops(n, 5, 7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert [len(x) for x in a] == [1, 3, 5, 5]
    assert all(np.all(np.diff(x) > 0) and x.max() < m for x, m in zip(a, n))
    assert any(not np.array_equal(x, y) for x, y in zip(a, pr.sample_crops(n, 5, 8)))
    with pytest.raises(ValueError, match="k=0"):
        pr.sample_crops(n, 0, 0)


def test_select_gallery_uniform_order_free_and_deduplicated():
    pages = _pages(40)
    pages[5]["spans"] = []                                   # no text: skipped, counted
    pages[7]["spans"] = [{"text": "  \n ", "bbox": [0, 0, 1, 1]}]
    pages[12]["spans"] = [dict(s) for s in pages[30]["spans"]]  # same text as p030: p012 wins
    gal, counts = pr.select_gallery(pages, 1000, 8)
    ids = [g["id"] for g in gal]
    assert len(gal) == 37 and "p012" in ids and "p030" not in ids
    assert counts["skipped"] == {"no_usable_span": 2, "duplicate_text": 1, "bad_image": 0}
    assert counts["pages_seen"] == 40 and gal[0]["image"].shape == (3, 8, 8)
    shuffled = pages[::-1]
    small_a = [g["id"] for g in pr.select_gallery(pages, 10, 8, seed=3)[0]]
    small_b = [g["id"] for g in pr.select_gallery(shuffled, 10, 8, seed=3)[0]]
    assert small_a == small_b and len(small_a) == 10
    assert small_a != [g["id"] for g in pr.select_gallery(pages, 10, 8, seed=4)[0]]
    with pytest.raises(ValueError, match="p001' occurs twice"):
        pr.select_gallery(pages + [pages[1]], 10, 8)


def test_bad_image_is_a_recorded_skip():
    pages = _pages(4)
    pages[2]["image"] = "not an image"
    gal, counts = pr.select_gallery(pages, 10, 8)
    assert [g["id"] for g in gal] == ["p000", "p001", "p003"] and counts["skipped"]["bad_image"] == 1
    assert counts["bad_image_examples"][0].startswith("p002: AttributeError")


@pytest.mark.parametrize("aggregation", ["max", "lse"])
def test_faiss_rescoring_matches_exact(aggregation):
    g = torch.Generator().manual_seed(0)
    crops = F.normalize(torch.randn(30, D, generator=g), dim=-1)
    gallery = F.normalize(torch.randn(50, D, generator=g), dim=-1)
    idx = torch.randint(0, 30, (12, 4), generator=g)
    idx[3, 1:] = -1
    exact = pr.multi_positive_search(crops, idx, gallery, 10, aggregation, 0.05)
    approx = pr.multi_positive_search(crops, idx, gallery, 10, aggregation, 0.05, use_faiss=True,
                                      candidates=50 if aggregation == "lse" else 10)
    assert torch.equal(exact[1], approx[1])
    torch.testing.assert_close(exact[0], approx[0])


def test_evaluate_matches_brute_force_and_is_deterministic():
    pages = _pages(60)
    model = _model_for(pages)
    enc = FakeTextEncoder()
    res = pr.evaluate_page_retrieval(model, pages, enc, _cfg(), progress=False)
    assert res["n_gallery"] == 60 and res["search"] == "exact" and res["n_docs"] == 15
    for scoring in pr.SCORINGS:
        for k in (1, 3, 8):
            for seed in (0, 1):
                want = _brute_force(pages, model, k, seed, scoring)
                got = res["per_seed"][scoring][k][seed]
                for m in pr.MEASURES:
                    assert got[m] == pytest.approx(want[m], abs=1e-9), (scoring, k, seed, m)
    # one crop: every scoring is the crop's own cosine
    assert res["per_seed"]["multi_positive"][1] == res["per_seed"]["single_positive"][1]
    # spread is over seeds
    v = [res["per_seed"]["multi_positive"][8][s]["Acc@1"] for s in (0, 1)]
    assert res["summary"]["multi_positive"][8]["Acc@1"]["std"] == pytest.approx(np.std(v, ddof=1))  # sample std over the seeds
    again = pr.evaluate_page_retrieval(model, pages, FakeTextEncoder(), _cfg(), progress=False)
    assert again["per_seed"] == res["per_seed"]
    # more crops help an informative model
    acc = [res["summary"]["multi_positive"][k]["Acc@1"]["mean"] for k in (1, 3, 8)]
    assert acc[0] < acc[2]


@pytest.mark.parametrize("aggregation", ["mean", "max"])
def test_other_aggregations_match_brute_force(aggregation):
    pages = _pages(30)
    model = _model_for(pages)
    res = pr.evaluate_page_retrieval(model, pages, FakeTextEncoder(),
                                     _cfg(ks=[4], seeds=[2], aggregation=aggregation,
                                          scorings=["multi_positive"]), progress=False)
    want = _brute_force(pages, model, 4, 2, "multi_positive", aggregation)
    assert res["per_seed"]["multi_positive"][4][2] == pytest.approx(want)


def test_each_text_is_encoded_once_and_bad_config_is_named():
    pages = _pages(20)
    enc = FakeTextEncoder()
    pr.evaluate_page_retrieval(_model_for(pages), pages, enc, _cfg(ks=[1], seeds=[0, 1, 2]), progress=False)
    # only sampled crops are encoded, each once; k=1 single-positive texts are those crops
    n = [len(p["spans"]) for p in sorted(pages, key=lambda p: p["id"])]
    sampled = [set().union(*(set(pr.sample_crops(n, 1, s)[q].tolist()) for s in (0, 1, 2))) for q in range(len(n))]
    assert enc.calls == sum(len(x) for x in sampled) < sum(n)
    with pytest.raises(ValueError, match="unknown scoring 'sp'"):
        pr.evaluate_page_retrieval(_model_for(pages), pages, enc, _cfg(scorings=["sp"]), progress=False)
    with pytest.raises(ValueError, match="at least 2 usable pages"):
        pr.evaluate_page_retrieval(_model_for(pages), pages[:1], enc, _cfg(), progress=False)


def test_cached_encoder_shares_texts_across_models():
    pages = _pages(20)
    enc = FakeTextEncoder()
    shared = pr.CachedTextEncoder(enc)
    a = pr.evaluate_page_retrieval(_model_for(pages, 0.5), pages, shared, _cfg(ks=[2], seeds=[0]), progress=False)
    n_first = enc.calls
    b = pr.evaluate_page_retrieval(_model_for(pages, 2.0), pages, shared, _cfg(ks=[2], seeds=[0]), progress=False)
    assert enc.calls == n_first  # the second model reuses every encoded text
    plain = pr.evaluate_page_retrieval(_model_for(pages, 2.0), pages, FakeTextEncoder(), _cfg(ks=[2], seeds=[0]),
                                       progress=False)
    assert b["per_seed"] == plain["per_seed"] and a["per_seed"] != b["per_seed"]


def test_text_cache_file_round_trip(tmp_path):
    enc = FakeTextEncoder()
    cache = pr.CachedTextEncoder(enc, tmp_path / "cache.safetensors")
    first = cache.encode(["a b", "c", "a b"])
    assert cache.save() == tmp_path / "cache.safetensors" and enc.calls == 2
    again = pr.CachedTextEncoder(enc, tmp_path / "cache.safetensors")
    assert torch.equal(again.encode(["c", "a b"]), first[[1, 0]]) and enc.calls == 2

    class Other(FakeTextEncoder):
        name = "other-encoder"
    with pytest.raises(ValueError, match="text cache of encoder 'FakeTextEncoder', not 'other-encoder'"):
        pr.CachedTextEncoder(Other(), tmp_path / "cache.safetensors")


def test_embedding_spread_detects_collapse():
    same = F.normalize(torch.ones(10, D), dim=-1)
    assert pr.embedding_spread(same) == pytest.approx({"mean_pairwise_cos": 1.0, "effective_rank": 1.0})
    basis = torch.eye(D)[:8]
    assert pr.embedding_spread(basis) == pytest.approx({"mean_pairwise_cos": 0.0, "effective_rank": 8.0})


def test_text_gallery_diagnostic_matches_brute_force():
    pages = _pages(30)
    res = pr.evaluate_page_retrieval(_model_for(pages), pages, FakeTextEncoder(),
                                     _cfg(ks=[2], seeds=[0], gallery_side="text", scorings=["single_positive"]),
                                     progress=False)
    ids = sorted(p["id"] for p in pages)
    by_id = {p["id"]: p for p in pages}
    gal = _unit(np.stack([sum(_vec(s["text"]) for s in by_id[i]["spans"]) for i in ids]))
    picks = pr.sample_crops([len(by_id[i]["spans"]) for i in ids], 2, 0)
    q = _unit(np.stack([sum(_vec(by_id[i]["spans"][j]["text"]) for j in p) for i, p in zip(ids, picks)]))
    scores = q @ gal.T
    ranks = 1 + (scores > scores.diagonal()[:, None]).sum(1)
    assert res["per_seed"]["single_positive"][2][0]["Acc@1"] == pytest.approx(np.mean(ranks == 1))
    assert res["per_seed"]["single_positive"][2][0]["MRR"] == pytest.approx(np.mean(1.0 / ranks))


def test_config_comes_from_the_one_loader():
    pages = _pages(5)
    with pytest.raises(ConfigError, match="unknown config key 'retrieval.n_galery'; "
                                          "did you mean 'retrieval.n_gallery'"):
        _cfg(n_galery=3)
    with pytest.raises(ConfigError, match=r"'retrieval.aggregation': 'median' is not one of lse \| mean \| max"):
        _cfg(aggregation="median")
    with pytest.raises(TypeError, match=r"cfg must be the eval config from gsdistill.config.load_config\('eval'"):
        pr.evaluate_page_retrieval(_model_for(pages), pages, FakeTextEncoder(), {"retrieval": {"n_gallery": 3}},
                                   progress=False)
    assert _cfg().retrieval.sp_separator == "\n" and _cfg().retrieval.temperature == 0.05
