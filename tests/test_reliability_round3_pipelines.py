"""The pipelines over the stages keep earlier results: a demo folder holding an earlier demo is refused
before any stage runs; an ablation's results.csv only gains rows measured at its own scale."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gsdistill.config import load_config
from gsdistill.errors import GsdistillError
from gsdistill.output_folder import FolderBusy, lock_folder
from gsdistill.pipelines import ablate, demo


def _no_stage(*_a, **_k):
    raise AssertionError("a stage ran")


def test_demo_into_an_earlier_demo_is_refused_before_any_stage(tmp_path, monkeypatch):
    (tmp_path / "report.md").write_text("earlier")
    (tmp_path / "pretrain" / "checkpoints").mkdir(parents=True)
    monkeypatch.setattr(demo, "build_tuples", _no_stage)
    cfg = load_config("demo", "smoke", [f"out_dir={tmp_path}"])
    with pytest.raises(GsdistillError):
        demo.run_demo(cfg)
    assert (tmp_path / "report.md").read_text() == "earlier" and not (tmp_path / "config.yaml").exists()
    file_out = tmp_path / "file"
    file_out.write_text("x")
    with pytest.raises(GsdistillError):
        demo.run_demo(load_config("demo", "smoke", [f"out_dir={file_out}"]))
    assert file_out.read_text() == "x"


def test_demo_overwrite_runs_the_stages_with_overwrite(tmp_path, monkeypatch):
    from gsdistill.output_folder import lock_folder
    with lock_folder(tmp_path):  # an earlier demo's report (recorded as gsdistill's, as a demo writes it)
        (tmp_path / "report.md").write_text("earlier")
    seen = {}

    def stages(cfg, out, overwrite):
        seen["overwrite"] = overwrite
        code = f"from gsdistill.output_folder import lock_folder\nwith lock_folder({str(out)!r}): pass"
        seen["second_writer_rc"] = subprocess.run([sys.executable, "-c", code], capture_output=True).returncode
        return out / "report.md"

    monkeypatch.setattr(demo, "_run_stages", stages)
    demo.run_demo(load_config("demo", "smoke", [f"out_dir={tmp_path}"]), overwrite=True)
    assert seen == {"overwrite": True, "second_writer_rc": 1}  # FolderBusy: the folder is held while stages run


def _fake_row(row, seed, cfg, out_dir, data_yaml, eval_pages):
    return {"label": row["label"], "table": row["table"], "experiment": row["experiment"], "seed": seed,
            "det_mAP50": 0.1, "det_mAP50-95": 0.05, "retrieval_acc1": 0.2, "retrieval_mrr": 0.3, "n_gallery": 50,
            "pretrain_s": 1, "detect_s": 1, "retrieval_s": 1}


def test_ablation_rows_of_another_scale_are_refused_more_seeds_are_not(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate, "run_row", _fake_row)
    monkeypatch.setattr(ablate, "detection_set", lambda cfg, out: out / "data.yaml")
    monkeypatch.setattr(ablate, "retrieval_pages", lambda cfg: ([], None))
    ablate.run_ablation(load_config("ablate", None, [f"out_dir={tmp_path}"]), ["sp_semantic"])
    before = (tmp_path / "results.csv").read_text()
    other = load_config("ablate", None, [f"out_dir={tmp_path}", "pretrain.optim.steps=7"])
    with pytest.raises(GsdistillError):
        ablate.run_ablation(other, ["sp_semantic"])
    assert (tmp_path / "results.csv").read_text() == before
    more = load_config("ablate", None, [f"out_dir={tmp_path}", "seeds=[0,1]", "threads=1"])
    ablate.run_ablation(more, ["sp_semantic"])
    assert len((tmp_path / "results.csv").read_text().splitlines()) == len(before.splitlines()) + 1


def test_ablation_folder_held_by_another_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(ablate, "run_row", _no_stage)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom gsdistill.output_folder import "
                               f"lock_folder\nwith lock_folder({str(tmp_path)!r}):\n    print('held', flush=True)\n"
                               "    time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusy):
            ablate.run_ablation(load_config("ablate", None, [f"out_dir={tmp_path}"]), ["sp_semantic"])
    finally:
        holder.kill()
        holder.wait()
    with lock_folder(tmp_path):
        pass
