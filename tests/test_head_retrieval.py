"""Head retrieval (a page found from its own cached texts) and the document-level bootstrap."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from gsdistill.pipelines.demo_learning import paired_gain
from gsdistill.eval.head_retrieval import bootstrap_by_document, head_retrieval

N = 6


class GreyLevelModel:
    """Reads which page an image is from its grey level (page i is solid 20 * i + 10): one-hot rows."""

    def _index(self, x):
        mean = torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
        level = ((x * std + mean) * 255).mean(dim=(1, 2, 3))
        return ((level - 10) / 20).round().long().clamp(0, N - 1)

    def embed_pages_geom(self, x):
        return F.one_hot(self._index(x), N).float()

    embed_pages = embed_pages_geom

    def embed_text_geom(self, t):
        return t

    embed_text_sem = embed_text_geom

    def to(self, device):
        return self

    def eval(self):
        return self


def pages(geom_rows):
    """Page i with texts ``geom_rows[i]``: an int is that page's one-hot, a vector is used as it is."""
    out = []
    for i, rows in enumerate(geom_rows):
        img = Image.new("RGB", (40, 50), (20 * i + 10,) * 3)
        emb = np.stack([np.eye(N, dtype=np.float32)[r] if np.isscalar(r) else np.asarray(r, np.float32) for r in rows])
        out.append({"id": f"p{i}", "doc_id": f"d{i // 2}", "image": img, "width": 40, "height": 50,
                    "geom_emb": emb, "sem_emb": emb})
    return out


def test_each_page_is_found_from_its_own_texts_and_swaps_are_misses():
    right = head_retrieval(GreyLevelModel(), pages([[i, i] for i in range(N)]), "geom", image_size=32)
    assert right["acc1"] == 1.0 and right["mrr"] == 1.0 and right["n_pages"] == N and right["n_docs"] == 3
    assert right["chance"] == pytest.approx(1 / N) and right["aggregation"] == "mean"
    rows = [[i, i] for i in range(N)]
    rows[0], rows[1] = [1, 1], [0, 0]  # pages 0 and 1 carry each other's descriptors
    swapped = head_retrieval(GreyLevelModel(), pages(rows), "geom", image_size=32)
    assert swapped["hits"] == [0, 0, 1, 1, 1, 1]
    # a swapped page: one page scores higher, four tie with it at 0 -> mid-rank 1 + 1 + 4 / 2 = 4
    assert swapped["mrr"] == pytest.approx((0.25 + 0.25 + 4) / N)


def test_mean_aggregation_needs_the_set_while_lse_follows_the_best_text():
    # page 0: one text exactly its own, two texts mostly page 1's. lse at a low temperature follows the
    # best text (a hit), the mean over the set points at page 1 (a miss)
    u = 0.2 * np.eye(N)[0] + 0.98 * np.eye(N)[1]
    rows = [[0, u, u]] + [[i] for i in range(1, N)]
    lse = head_retrieval(GreyLevelModel(), pages(rows), "geom", 32, aggregation="lse", temperature=0.01)
    mean = head_retrieval(GreyLevelModel(), pages(rows), "geom", 32)
    assert lse["hits"][0] == 1 and mean["hits"][0] == 0


def test_k_texts_are_drawn_per_query_and_ties_are_not_hits():
    rows = [[i, (i + 1) % N, (i + 2) % N] for i in range(N)]  # only the first text is the page's own
    one = [head_retrieval(GreyLevelModel(), pages(rows), "sem", 32, k=1, seed=s)["acc1"] for s in range(8)]
    assert min(one) < 1.0 and max(one) > 0.0  # which text is drawn changes the result
    # with all three texts averaged, pages i, i+1, i+2 tie: no hit, rank 2 (1 + 2 ties / 2)
    tied = head_retrieval(GreyLevelModel(), pages(rows), "sem", 32, k=3, aggregation="mean")
    assert tied["acc1"] == 0.0 and tied["mrr"] == pytest.approx(0.5)


def test_document_bootstrap_is_wider_than_page_bootstrap_for_correlated_pages():
    hits = np.repeat([1.0] * 5 + [0.0] * 5, 10)  # 10 documents of 10 pages; a document hits all or nothing
    docs = [f"d{i // 10}" for i in range(100)]
    lo, hi = bootstrap_by_document(hits, docs)
    plo, phi = bootstrap_by_document(hits, [str(i) for i in range(100)])  # one page per "document"
    assert lo <= 0.5 <= hi and (hi - lo) > 2 * (phi - plo)
    assert bootstrap_by_document(np.ones(20), docs[:20]) == (1.0, 1.0)


def test_paired_gain_is_the_mean_difference_of_hits():
    rows = [{"model": m, "split": "s", "head": "geom", "k": "all", "hits": h}
            for m, h in (("a", [0, 0, 1, 0]), ("b", [1, 1, 1, 0]))]
    g = paired_gain(rows, "a", "b", "s", "geom", "all", doc_of=["x", "x", "y", "y"])
    assert g["diff"] == pytest.approx(0.5) and g["ci95"][0] <= 0.5 <= g["ci95"][1]
    assert paired_gain(rows, "a", "c", "s", "geom", "all") is None


def test_semantic_rows_carry_the_text_height_and_geometric_rows_do_not():
    from gsdistill.pipelines.demo_learning import retrieval_markdown
    rows = [{"model": "m", "split": "s", "head": h, "k": k, "acc1": 0.25, "ci95": [0.0, 0.5], "chance": 0.125,
             "effective_rank": 3.0} for h, k in (("geom", "all"), ("sem", 1))]
    table = retrieval_markdown(rows, "s", "text in view: Section-header 8.8 px").splitlines()
    assert table[2].startswith("| geometric: all box descriptors | 12.5 | 25.0 [0.0, 50.0] |")
    assert "8.8 px" not in table[2]
    assert table[3].startswith("| semantic: 1 text crop(s) (text in view: Section-header 8.8 px) | 12.5 |")


def test_text_height_in_view_scales_the_box_height_to_the_view():
    from gsdistill.pipelines.demo_report import text_height_in_view
    page = {"height": 640, "spans": [{"category": "Section-header", "bbox": [0, 100, 50, 164]},
                                     {"category": "Text", "bbox": [0, 0, 50, 300]}]}
    assert text_height_in_view([page], 112) == {"Section-header": pytest.approx(64 * 112 / 640)}
