"""Issue 33 row 5: pretraining config values are checked at start-up, before any page is generated
or embedded: one line naming the key, exit 2, never a traceback (``gsdistill pretrain``, ``demo``,
``ablate``, and ``detect train``'s random backbone)."""
from __future__ import annotations

import re

import pytest

from gsdistill.cli import main
from gsdistill.config import ConfigError, load_config
from gsdistill.pipelines import ablate


@pytest.mark.parametrize("overrides, message", [
    (["model.backbone.name=resnet50"], r"model.backbone.name='resnet50' is not a timm ViT"),
    (["model.backbone.name=vit_tiny_patch16_225"], r"is not a timm model .*did you mean 'vit_tiny_patch16_224'"),
    (["model.backbone.name=vit_tiny"], r"model.backbone.name='vit_tiny'.*did you mean 'vit_tiny_patch"),
    (["data.page_width=128", "data.page_height=160"],
     r"data.page_width=128, data.page_height=160: synthetic pages need at least 200x200"),
    (["data.text_scale=10"], r"data.text_scale=10.0: synthetic text_scale must be in \[0.5, 4\]"),
    (["model.backbone.embed_dim=100", "model.backbone.num_heads=3"],
     r"model.backbone: timm cannot build vit_tiny_patch16_224 .*divisible by num_heads"),
    (["views.global_size=100"], r"views.global_size=100 is not a multiple of the patch size 16"),
    (["objective.loss=mpcll"], r"objective.loss='mpcll': unknown loss; did you mean 'mpcl'"),
    (["objective.loss_geom=nope"], r"objective.loss_geom='nope': unknown loss"),
    (["data.descriptor_format=foo"], r"data.descriptor_format: unknown descriptor format 'foo'"),
    (["model.text_encoder=no-such-encoder"], r"model.text_encoder='no-such-encoder': not a local folder"),
])
def test_bad_pretrain_values_stop_before_any_data(tmp_path, capsys, overrides, message):
    run = tmp_path / "run"
    assert main(["pretrain", *overrides, "--run-dir", str(run), "train.device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("gsdistill pretrain: config error: ")
    assert re.search(message, err), err
    assert not run.exists()  # nothing generated, embedded or written


def test_every_shipped_pretrain_experiment_passes():
    from gsdistill.config import configs_dir
    from gsdistill.pretrain.config_checks import check_pretrain_config
    for path in sorted((configs_dir() / "pretrain").glob("*.yaml")):
        cfg = load_config("pretrain", None if path.stem == "default" else path.stem)
        check_pretrain_config(cfg)


def test_own_batches_need_no_data_keys():
    from gsdistill.pretrain.config_checks import check_pretrain_config
    cfg = load_config("pretrain", None, ["data.page_width=100", "data.shards=/nowhere"])
    check_pretrain_config(cfg, data=False)  # tests and benches feed their own batches
    with pytest.raises(ConfigError, match="model.backbone.name='resnet50'"):
        check_pretrain_config(load_config("pretrain", None, ["model.backbone.name=resnet50"]), data=False)


def test_demo_checks_pages_and_pretraining_before_building_tuples(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "data.page_width=150"]) == 2
    err = capsys.readouterr().err.strip()
    assert "data.page_width=150" in err and "200x200" in err and len(err.splitlines()) == 1
    assert main(["demo", "--out", str(out), "pretrain=[model.backbone.name=resnet50]"]) == 2
    assert "model.backbone.name='resnet50' is not a timm ViT" in capsys.readouterr().err
    assert not out.exists()


def test_ablate_checks_every_pending_row_before_making_data(tmp_path, monkeypatch):
    def no_data(*_args):
        raise AssertionError("data prepared before the rows' configs were checked")

    monkeypatch.setattr(ablate, "detection_set", no_data)
    monkeypatch.setattr(ablate, "retrieval_pages", no_data)
    cfg = load_config("ablate", None, [f"out_dir={tmp_path}", "pretrain.model.backbone.name=vit_tiny_patch16_225"])
    with pytest.raises(ConfigError, match="did you mean 'vit_tiny_patch16_224'"):
        ablate.run_ablation(cfg, ["sp_semantic"])


def test_backbone_check_names_the_key_it_is_given():
    from gsdistill.pretrain.config_checks import check_backbone
    with pytest.raises(ConfigError, match=r"random_backbone.name='vit_tinny_patch16_224'.*did you mean"):
        check_backbone({"name": "vit_tinny_patch16_224"}, key="random_backbone")
    assert check_backbone({"name": "vit_small_patch16_224", "depth": 2}) == 16
