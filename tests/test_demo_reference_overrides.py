"""``detect_reference_overrides``: the stock reference trains with its own detect overrides (e.g. its
learning rate) on top of ``detect``, while the head-only detectors keep ``detect``'s; the few-labels /
few-epochs settings give the reference the same optimizer steps as the heads."""
from __future__ import annotations

from pathlib import Path

from gsdistill.config import load_config


def _fake_training(monkeypatch):
    import gsdistill.detect.compare as compare
    import gsdistill.detect.map_bootstrap as boot
    import gsdistill.detect.subset as subset

    seen = []

    def fake_compare(data, backbones, seeds, cfg, out_dir):
        seen.append((sorted(backbones), float(cfg.lr0), int(cfg.epochs), Path(out_dir).name))
        return [{"backbone": b, "seed": s, "map50": 0.1, "optimizer_steps": 8 * int(cfg.epochs)}
                for s in seeds for b in backbones]

    monkeypatch.setattr(compare, "compare_backbones", fake_compare)
    monkeypatch.setattr(boot, "rows_bootstrap", lambda rows, data, a, b, seed=0: {"a": a, "b": b})
    monkeypatch.setattr(subset, "train_images", lambda data: 16)
    return seen


def test_the_reference_gets_its_own_overrides_in_every_budget_setting(monkeypatch, tmp_path):
    from gsdistill.pipelines.demo_budgets import detect_budgets

    seen = _fake_training(monkeypatch)
    cfg = load_config("demo", None, ["detect=[epochs=4,lr0=0.01]", "detect_reference_overrides=[lr0=0.002]",
                                     "detect_head_epochs=[2]"])
    results = detect_budgets(cfg, tmp_path / "data.yaml", tmp_path / "backbone", tmp_path)
    heads, reference = seen
    assert heads == (["pretrained", "random backbone"], 0.01, 2, "setting0")
    assert reference == (["yolov10n.yaml (stock, all layers trained)"], 0.002, 2, "reference")
    assert set(results[0]["map50"]) == {"pretrained", "random backbone", "yolov10n.yaml (stock, all layers trained)"}
    assert results[0]["paired"]["reference"]["a"] == "yolov10n.yaml (stock, all layers trained)"


def test_without_overrides_the_reference_trains_as_the_heads(monkeypatch, tmp_path):
    from gsdistill.pipelines.demo_budgets import detect_budgets

    seen = _fake_training(monkeypatch)
    cfg = load_config("demo", None, ["detect=[epochs=4,lr0=0.01]", "detect_head_epochs=[3]"])
    detect_budgets(cfg, tmp_path / "data.yaml", tmp_path / "backbone", tmp_path)
    assert [(lr, epochs) for _, lr, epochs, _ in seen] == [(0.01, 3), (0.01, 3)]


def test_long_benchmark_heads_and_reference_learning_rates():
    """The long benchmark's heads train at lr0 0.01 and its stock reference at 0.002: each at the rate
    measured best for it on those pages (docs/learning.md, "The head's learning rate"); the heads with
    YOLOv10's neck ("A neck for the head")."""
    cfg = load_config("demo", "pdfs_long", ["pdfs=/x"])
    heads = load_config("detect", "compare", [*cfg.detect])
    reference = load_config("detect", "compare", [*cfg.detect, *cfg.detect_reference_overrides])
    assert heads.lr0 == 0.01 and reference.lr0 == 0.002 and heads.epochs == reference.epochs == 16
    assert heads.adapter_neck == "pan"
