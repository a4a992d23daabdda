"""The config system: defaults <- experiment chain <- key=value overrides, strict keys with hints."""
from pathlib import Path

import pytest
import yaml
from omegaconf.errors import ConfigAttributeError

from gsdistill.config import ConfigError, load_config, parse_overrides, save_config


@pytest.fixture()
def tree(tmp_path, monkeypatch):
    stage = tmp_path / "configs" / "toy"
    stage.mkdir(parents=True)
    (stage / "default.yaml").write_text(
        "train:\n  lr: 0.001  # learning rate\n  steps: 10\n  betas: [0.9, 0.999]\n"
        "model:\n  name: vit_tiny_patch16_224\n  depth: 4\nseed: 0\n")
    (stage / "small.yaml").write_text("train:\n  steps: 3\n")
    (stage / "smaller.yaml").write_text("_base_: small.yaml\nmodel:\n  depth: 2\n")
    (stage / "typo.yaml").write_text("train:\n  step: 3\n")
    monkeypatch.setenv("GSDISTILL_CONFIGS", str(tmp_path / "configs"))
    return stage


def test_defaults_experiment_chain_and_overrides(tree):
    cfg = load_config("toy", "smaller", ["train.lr=0.5", "model.name=vit_small_patch16_224",
                                          "train.betas=[0.8, 0.9]"])
    assert cfg.train.steps == 3          # from small.yaml through _base_
    assert cfg.model.depth == 2          # from smaller.yaml
    assert cfg.train.lr == 0.5 and isinstance(cfg.train.lr, float)
    assert list(cfg.train.betas) == [0.8, 0.9]
    assert cfg.model.name == "vit_small_patch16_224"


def test_unknown_override_key_gets_did_you_mean(tree):
    with pytest.raises(ConfigError, match=r"unknown config key 'train.step'.*did you mean 'train.steps'"):
        load_config("toy", None, ["train.step=5"])


def test_unknown_key_in_experiment_file_names_the_file(tree):
    with pytest.raises(ConfigError, match=r"typo.yaml: unknown config key 'train.step'.*'train.steps'"):
        load_config("toy", tree / "typo.yaml")


def test_struct_lock_rejects_new_keys_after_loading(tree):
    cfg = load_config("toy")
    with pytest.raises(ConfigAttributeError, match=r"Key 'new_key' is not in struct"):
        cfg.train.new_key = 1
    with pytest.raises(ConfigAttributeError, match=r"Key 'stepz' is not in struct"):
        cfg.train.stepz  # noqa: B018  (a misspelled read is an error too, never None)
    assert "new_key" not in cfg.train and cfg.train.steps == 10


def test_override_values_are_parsed_not_evaluated(tree):
    cfg = load_config("toy", None, ["model.name=__import__('os').system('false')"])
    assert cfg.model.name == "__import__('os').system('false')"
    assert parse_overrides(["a=1", "b=true", "c=null", "d=x=y"]) == [("a", 1), ("b", True), ("c", None), ("d", "x=y")]
    # YAML 1.1 would read 1e-4 as a string; configs always mean the number
    assert parse_overrides(["lr=1e-4", "x=[2E3, 5]", "name=1e-4x"]) == [("lr", 1e-4), ("x", [2000.0, 5]), ("name", "1e-4x")]
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["novalue"])


def test_missing_file_and_bad_yaml_are_clear(tree):
    with pytest.raises(ConfigError, match="not found"):
        load_config("toy", tree / "nope.yaml")
    (tree / "bad.yaml").write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config("toy", tree / "bad.yaml")


def test_resolved_config_round_trips(tree, tmp_path):
    cfg = load_config("toy", "small", ["seed=7"])
    path = save_config(cfg, tmp_path / "run")
    assert yaml.safe_load(Path(path).read_text())["seed"] == 7
    again = load_config("toy", path)
    assert again == cfg


def test_every_shipped_stage_default_loads():
    root = Path(__file__).resolve().parents[1] / "configs"
    stages = [p.parent.name for p in root.glob("*/default.yaml")]
    for stage in stages:
        cfg = load_config(stage)
        assert len(cfg) > 0, stage


def test_values_without_a_stated_type_keep_the_kind_of_their_default(tree):
    cfg = load_config("toy", None, ["train.lr=1", "train.steps=4.0"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)  # int given to a float default
    assert cfg.train.steps == 4 and isinstance(cfg.train.steps, int)
    with pytest.raises(ConfigError, match=r"'train.steps': 'many' is not of type int"):
        load_config("toy", None, ["train.steps=many"])
    with pytest.raises(ConfigError, match=r"'train' is a section \(a mapping of keys\), got 3"):
        load_config("toy", None, ["train=3"])
    with pytest.raises(ConfigError, match=r"'train.betas': 'x' is not of type list"):
        load_config("toy", None, ["train.betas=x"])
