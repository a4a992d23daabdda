"""The shared logging / plotting layer: CSV + TensorBoard rows (a resumed run drops the unsaved
tail), growing result tables, and the PNG line and bar plots every stage draws with it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from PIL import Image

from gsdistill.detect.run_logging import plot_results
from gsdistill.run_log import Line, Panel, RunLog, append_row, bar_plot, line_plot, read_rows, write_rows

ROOT = Path(__file__).resolve().parents[1]


def test_run_log_rows_tensorboard_and_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = RunLog(tmp_path, tensorboard=True)
    for step in (1, 2, 3):
        log.log(step, {"total": 1.0 / step, "loss_name": "single_lh", "epoch": 0})
    log.close()
    rows = read_rows(tmp_path / "metrics.csv")
    assert [(r["step"], r["total"], r["loss_name"]) for r in rows] == [
        ("1", "1.0", "single_lh"), ("2", "0.5", "single_lh"), ("3", str(1 / 3), "single_lh")]
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert sorted(events.Tags()["scalars"]) == ["train/epoch", "train/total"]  # text stays in the CSV
    scalars = events.Scalars("train/total")  # float32 in the event file
    assert [e.step for e in scalars] == [1, 2, 3]
    assert [e.value for e in scalars] == pytest.approx([1.0, 0.5, 1 / 3], rel=1e-7)
    resumed = RunLog(tmp_path, tensorboard=False, resume_step=1)  # steps 2-3 were never checkpointed
    resumed.log(2, {"total": 0.25, "loss_name": "x", "epoch": 1, "new_column": 7})
    assert [(r["step"], r["total"], r["epoch"]) for r in read_rows(tmp_path / "metrics.csv")] == [
        ("1", "1.0", "0"), ("2", "0.25", "1")]
    RunLog(tmp_path, tensorboard=False).log(5, {"total": 2.0})  # a fresh run starts a fresh file
    assert read_rows(tmp_path / "metrics.csv") == [{"step": "5", "total": "2.0"}]


def test_result_tables_grow_row_by_row(tmp_path):
    path = tmp_path / "sub" / "results.csv"
    append_row(path, {"key": "a", "score": 1, "ignored": 3}, ["key", "score"])
    append_row(path, {"key": "b", "score": 2}, ["key", "score"])
    assert read_rows(path) == [{"key": "a", "score": "1"}, {"key": "b", "score": "2"}]
    write_rows(path, [{"x": 1}])
    assert path.read_text().splitlines() == ["x", "1"]


def test_plots_are_pngs_of_the_asked_size(tmp_path):
    panels = [Panel("loss", [Line("a", [1, 2, 3], [3.0, 2.0, 1.0]), Line("b", [1, 2], [1.0, 1.5], err=[0.1, 0.2])],
                    hlines={"chance": 0.5}), Panel("grad norm", [Line("", [1, 2], [0.3, 0.2])])]
    png = line_plot(tmp_path / "plots" / "lines.png", panels, panel_size=(4.0, 3.0), dpi=50)
    assert Image.open(png).size == (400, 150)
    bars = bar_plot(tmp_path / "bars.png", ["x", "y", "z"], {"A": ([1.0, 2.0, float("nan")], [0.1, 0.2, 0.0]),
                                                            "B": ([3.0, 1.0, 2.0], None)}, dpi=50)
    assert Image.open(bars).size == (550, int((0.45 * 3 + 1.8) * 50))


def test_stage_plots_go_through_the_layer(tmp_path):
    results = tmp_path / "results.csv"  # Ultralytics pads its column names
    results.write_text("  epoch,  train/box_loss,  metrics/mAP50(B)\n1,2.0,0.1\n2,1.5,0.2\n")
    assert Image.open(plot_results(results, tmp_path / "training.png")).size == (1000, 400)
    (tmp_path / "empty.csv").write_text("epoch,train/box_loss\n")
    assert plot_results(tmp_path / "empty.csv", tmp_path / "none.png") is None
    spec = importlib.util.spec_from_file_location("retriever_table", ROOT / "tools" / "experiments" / "retriever_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    rows = [{"key": "zero_shot", "nDCG@10": "0.30"}, {"key": "single_lh", "nDCG@10": "0.31"},
            {"key": "single_lh", "nDCG@10": "0.33"}]
    assert Image.open(table.plot_table(rows, tmp_path / "table.png")).size == (660, int((0.45 * 2 + 1.8) * 120))
