"""tools/probes/probe_layout_features.py: patch labels follow the boxes, and a probe separates features that carry layout."""
import numpy as np
import torch

from tool_loader import load_tool


def _tool():
    return load_tool("probes/probe_layout_features.py")


def test_patch_labels_take_the_box_under_each_patch_centre_smaller_boxes_win():
    tool = _tool()
    page = {"width": 64, "height": 64, "boxes": [
        {"category": "Text", "bbox": [0, 0, 64, 32]},            # top half: text (class 1)
        {"category": "Section-header", "bbox": [0, 0, 32, 16]},  # inside it, smaller: title (class 2)
        {"category": "Page-footer", "bbox": [0, 48, 64, 64]},    # dropped by the PubLayNet folding
    ]}
    labels = tool.patch_labels(page, size=64, patch=16).reshape(4, 4)
    expected = np.array([[2, 2, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(labels, expected)


def test_balanced_accuracy_counts_each_present_class_equally():
    tool = _tool()
    y = np.array([[0, 0, 0, 1]])
    pred = np.array([[0, 0, 0, 0]])  # all background: 3/4 patches right, but class 1 missed
    hits = tool.page_hits(pred, y, n_cls=3)
    assert tool.balanced_acc(hits) == 0.5  # (1.0 + 0.0) / 2; class 2 is absent and not counted


def test_probe_separates_informative_features_from_noise():
    tool = _tool()
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (600,), generator=g)
    informative = torch.nn.functional.one_hot(y, 3).float() * 3 + torch.randn(600, 3, generator=g)
    noise = torch.randn(600, 3, generator=g)
    for x, lo, hi in ((informative, 0.9, 1.0), (noise, 0.0, 0.6)):
        probe = tool.fit_probe(x[:400], y[:400], 3, steps=100)
        pred = probe(x[400:]).argmax(1).numpy()[None]
        acc = tool.balanced_acc(tool.page_hits(pred, y[400:].numpy()[None], 3))
        assert lo <= acc <= hi


def test_token_stats_see_a_collapsed_feature_map():
    """Isotropic tokens: effective rank near the width, within-page cosine near 0. Tokens on one line
    (one direction, any scale): rank 1. Every patch of a page the same token: within-page cosine 1."""
    tool = _tool()
    g = torch.Generator().manual_seed(0)
    iso = torch.randn(8, 64, 16, generator=g)
    rank, within = tool.token_stats(iso)
    assert 14 < rank <= 16 and abs(within) < 0.05
    line = torch.randn(8, 64, 1, generator=g) * torch.randn(16, generator=g)
    assert abs(tool.token_stats(line)[0] - 1.0) < 1e-6
    same = torch.randn(8, 1, 16, generator=g).expand(8, 64, 16)
    assert abs(tool.token_stats(same)[1] - 1.0) < 1e-6


def test_subpatch_targets_are_each_patchs_own_normalised_ink_cells():
    """A 16 px patch inked on its top half: 4 x 4 cells, top two rows ink, per-patch centred and scaled;
    a blank patch is marked as holding no arrangement."""
    tool = _tool()
    img = torch.zeros(1, 3, 16, 32)
    img[:, :, :8, :16] = 1.0  # left patch: top half inked; right patch blank
    t, ink = tool.subpatch_targets(img, patch=16)
    assert t.shape == (1, 2, 16) and ink.tolist() == [[True, False]]
    left = t[0, 0].reshape(4, 4)
    raw = torch.tensor([1.0] * 8 + [0.0] * 8)
    expected = (raw - raw.mean()) / (raw.var() + 1e-2).sqrt()
    torch.testing.assert_close(left.reshape(-1), expected)
    assert torch.all(left[:2] > 0) and torch.all(left[2:] < 0)


def test_ridge_r2_is_one_for_a_linear_map_and_near_zero_for_noise():
    tool = _tool()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(800, 6, generator=g)
    y = x @ torch.randn(6, 3, generator=g)
    r2, err = tool.ridge_r2(x[:600], y[:600], x[600:], y[600:], lam=1e-6)
    assert r2 > 0.999 and err.shape == (200,)
    r2_noise, _ = tool.ridge_r2(torch.randn(800, 6, generator=g)[:600], y[:600], torch.randn(200, 6, generator=g), y[600:])
    assert r2_noise < 0.05


def test_paired_doc_bootstrap_takes_any_page_statistic():
    """With a mean-error statistic, a model whose every page errs more by 1 gets an interval around +1."""
    tool = _tool()
    rng = np.random.default_rng(0)
    b = rng.random((40, 1))
    docs = [f"d{i // 4}" for i in range(40)]
    lo, hi = tool.paired_doc_bootstrap(b + 1.0, b, docs, stat=lambda rows: rows.mean())
    assert 0.999 < lo <= hi < 1.001


def test_detect_data_zones_become_patch_classes_and_the_bootstrap_keeps_each_book(tmp_path):
    """--detect-data reads a detection folder's own COCO classes (the zones of `demo --coco`), and with strata the
    page bootstrap draws every book's pages from that book alone."""
    import json

    from PIL import Image
    tool = _tool()
    (tmp_path / "coco").mkdir()
    (tmp_path / "images" / "val").mkdir(parents=True)
    Image.new("RGB", (128, 64), "white").save(tmp_path / "images" / "val" / "bookA_0001.png")
    coco = {"images": [{"id": 7, "file_name": "bookA_0001.png", "width": 128, "height": 64}],
            "categories": [{"id": 2, "name": "NumberingZone"}, {"id": 1, "name": "MainZone"}],
            "annotations": [{"id": 1, "image_id": 7, "category_id": 1, "bbox": [0, 0, 128, 64]},  # the page: MainZone
                            {"id": 2, "image_id": 7, "category_id": 2, "bbox": [0, 0, 40, 20]}]}  # top left: numbers
    (tmp_path / "coco" / "val.json").write_text(json.dumps(coco))
    images, labels, docs, names = tool.load_detect_split(str(tmp_path / "data.yaml"), "val", size=64, patch=16)
    assert names == ["MainZone", "NumberingZone"] and docs == ["bookA"] and images.shape == (1, 3, 64, 64)
    np.testing.assert_array_equal(labels.reshape(4, 4), [[2, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    # two books, B's pages all better: a page bootstrap within each book never draws a resample without B
    a = np.zeros((6, 2, 2)); a[:, 1, 1] = 1
    b = a.copy(); b[3:, 1, 0] = 1  # pages 3-5 (book B): class 1 right in b, wrong in a
    strata = ["A", "A", "A", "B", "B", "B"]
    lo, hi = tool.paired_doc_bootstrap(b, a, [f"p{i}" for i in range(6)], strata=strata, n_boot=200)
    assert lo == hi == tool.balanced_acc(b) - tool.balanced_acc(a)  # every resample holds three A and three B pages
    lo, hi = tool.paired_doc_bootstrap(b, a, [f"p{i}" for i in range(6)], n_boot=200)
    assert lo < hi  # without strata the share of B's pages varies
