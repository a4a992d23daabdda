"""Config values are checked against the types and ranges the defaults' comments state (issue 12
item 5), for every stage; every stage's CLI turns the project's errors into one line, exit 2 (item 6)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gsdistill.cli import main
from gsdistill.config import ConfigError, embedded_stages, load_config
from gsdistill.config_schema import parse_spec, read_comments

STAGES = sorted(p.parent.name for p in (Path(__file__).resolve().parents[1] / "configs").glob("*/default.yaml"))


@pytest.mark.parametrize("override, message", [
    ("optim.lr=abc", r"'optim.lr': 'abc' is not of type float"),
    ("optim.steps=abc", r"'optim.steps': 'abc' is not of type int"),
    ("optim.lr=", r"'optim.lr': '' is not of type float \(empty value\)"),
    ("views.global_size=0", r"'views.global_size': 0 is out of range \(must be > 0\)"),
    ("optim.batch_size=0", r"'optim.batch_size': 0 is out of range \(must be > 0\)"),
    ("optim=3", r"'optim' is a section \(a mapping of keys\), got 3"),
    ("optim.steps=-5", r"'optim.steps': -5 is out of range \(must be > 0\)"),
    ("optim.steps=2.5", r"'optim.steps': 2.5 is not of type int"),
    ("train.engine=torchh", r"'train.engine': 'torchh' is not one of torch \| deepspeed"),
    ("views.mask_prob=1.5", r"'views.mask_prob': 1.5 is out of range \(must be in \[0, 1\]\)"),
    ("views.mask_ratio=[0.5, 0.1]", r"'views.mask_ratio'.*first value must not exceed the second"),
    ("optim.betas=[0.9]", r"'optim.betas': \[0.9\] is not a list of 2 values"),
    ("train.progress=maybe", r"'train.progress': 'maybe' is not of type bool"),
    ("optim.warmup_steps=-1", r"'optim.warmup_steps': -1 is out of range \(must be >= 0\)"),
    ("model.backbone.depth=0", r"'model.backbone.depth': 0 is out of range"),
])
def test_bad_pretrain_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("pretrain", None, [override])


def test_good_values_are_normalised():
    cfg = load_config("pretrain", None, ["optim.lr=1", "optim.steps=1e3", "data.shards=2024", "train.stop_after=null",
                                         "optim.warmup_steps=0", "views.n_local=0", "objective.queue_size=0"])
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.steps == 1000 and isinstance(cfg.optim.steps, int)
    assert cfg.data.shards == "2024"  # a str key given a number keeps its text


@pytest.mark.parametrize("stage, override, message", [
    ("detect", "epochs=0", r"'epochs': 0 is out of range"),
    ("detect", "optimizer=Adamw", r"not one of SGD \| Adam \| AdamW \| auto"),
    ("detect", "augment.fliplr=2", r"'augment.fliplr': 2.0 is out of range \(must be in \[0, 1\]\)"),
    ("eval", "retrieval.ks=[1, 0]", r"'retrieval.ks': 0 is out of range"),
    ("eval", "retrieval.temperature=0", r"'retrieval.temperature': 0.0 is out of range \(must be > 0\)"),
    ("eval", "retrieval.aggregation=sum", r"not one of lse \| mean \| max"),
    ("retriever", "train.amp=fp8", r"not one of auto \| bf16 \| fp16 \| off"),
    ("retriever", "train.batch_size=x", r"'train.batch_size': 'x' is not of type int"),
    ("tuples", "build.image_format=gif", r"not one of zst \| png \| jpg"),
    ("ablate", "seeds=3", r"'seeds': 3 is not of type list"),
    ("demo", "data.eval_fraction=1.5", r"out of range \(must be in \[0, 1\]\)"),
])
def test_every_stage_checks_its_values(stage, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(stage, None, [override])


@pytest.mark.parametrize("stage, override", [
    ("detect", "device=0"), ("detect", "save_period=-1"), ("detect", "cache=ram"), ("eval", "retrieval.device=cuda:1"),
    ("retriever", "loss.kwargs={margin: 0.1}"), ("eval", "retrieval.use_faiss=true"), ("tuples", "build.max_pages=5"),
])
def test_legitimate_values_pass(stage, override):
    load_config(stage, None, [override])


def test_every_default_key_states_a_type_the_checker_reads():
    """Keys inside an embedded stage section (ablate's ``pretrain:``, ...) are checked against that
    stage's own defaults, so their comments need no type."""
    unchecked = []
    for stage in STAGES:
        root = Path(__file__).resolve().parents[1] / "configs" / stage
        defaults = load_config(stage)
        embedded = tuple(f"{section}." for section in embedded_stages(root / "default.yaml"))
        for key, comment in read_comments(root / "default.yaml").items():
            if key.startswith(embedded):
                continue
            node = defaults
            for part in key.split("."):
                node = node[part]
            if not hasattr(node, "keys") and not hasattr(node, "append") and parse_spec(comment) is None:
                unchecked.append(f"{stage}:{key}")
    assert unchecked == []


def test_comment_forms():
    assert parse_spec("int|null: blocks").types == {"int", "null"}
    assert parse_spec("(str|null) path").types == {"str", "null"}
    assert parse_spec("[float, float]: masked share").items == ["float", "float"]
    spec = parse_spec("list[int]: crops")
    assert spec.types == {"list"} and spec.element == "int"
    assert parse_spec("float > 0: temperature").bound == (">", 0.0)
    assert parse_spec("multi: MPCL over spans | single: SP, one text").choices == ["multi", "single"]
    assert parse_spec("semantic | dual (semantic + geometric) | joint (one head)").choices == ["semantic", "dual", "joint"]
    assert parse_spec("str: beir | tevatron | dpr").choices == ["beir", "tevatron", "dpr"]
    assert parse_spec("(bool|str) Ultralytics image cache: false | ram | disk").choices == []
    assert parse_spec("any timm ViT, randomly initialised") is None
    assert parse_spec("multi_positive: each crop embedded alone") is None


def test_experiment_file_values_are_checked_and_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  steps: -5\n")
    with pytest.raises(ConfigError, match=r"'optim.steps': -5"):
        load_config("pretrain", bad)


def test_cli_reports_config_and_file_errors_in_one_line_with_exit_2(tmp_path, capsys):
    assert main(["pretrain", "optim.steps=-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "optim.steps" in err and "must be > 0" in err
    missing = tmp_path / "nowhere"
    assert main(["pretrain", f"data.shards={missing}", "--run-dir", str(tmp_path / "run"), "train.device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err and "Traceback" not in err
    assert main(["pretrain", f"train.resume={missing}", "train.device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{missing}: no checkpoint found" in err
    assert not (tmp_path / "run" / "config.yaml").exists()
