"""``tools/gpu/gpu_step.py`` (issue "step" on a GPU) runs end to end on the CPU at tiny sizes: two trees
side by side, the compiled variant (``aot_eager``), the recipe-batch part, and a report whose numbers
are those of the workers. With the same tree on both sides, the counted FLOPs must be equal."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = ["model.backbone.depth=1", "model.backbone.img_size=32", "views.global_size=32", "views.local_size=16",
        "model.dino_out_dim=64", "model.dino_hidden_dim=32", "model.dino_bottleneck_dim=16", "model.proj_dim=32"]


@pytest.mark.slow  # 2-3 minutes here: eight worker processes, two compiled variants each cold and warm
def test_gpu_step_runs_old_and_new_side_by_side(tmp_path):
    old = tmp_path / "old"
    for part in ("gsdistill", "configs"):  # this tree as the "old" one: a second copy, imported from there
        shutil.copytree(REPO / part, old / part, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "tools/gpu/gpu_step.py", "--old-tree", str(old), "--experiment", "",
                           "--device", "cpu", "--batch", "2", "--recipe-batch", "4", "--steps", "3",
                           "--backend", "aot_eager", "--compile-budget", "300", "--out", str(out),
                           "--override", *TINY], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    res = json.loads((out / "gpu_step.json").read_text())
    pair = res["parts"]["old vs new, eager"]
    assert "error" not in pair, pair
    assert pair["old_flops"] == pair["new_flops"] > 0  # the same model on both sides
    assert pair["old_s"] > 0 and pair["new_s"] > 0
    assert pair["new_profile"]["kernels_per_step"] > 0 and len(pair["new_profile"]["top"]) == 8
    assert abs(sum(s for _, s in pair["new_profile"]["top"])) <= 1.0
    loop = res["parts"]["training loop vs engine step (new, eager)"]
    assert "error" not in loop, loop
    assert loop["engine_s"] > 0 and loop["loop_s"] > 0
    recipe = res["parts"]["new eager, batch 4"]
    assert recipe["s"] > 0 and recipe["flops"] > 0
    for variant, graphs in (("step", 1), ("blocks", 4)):  # padded batches: one shape, no recompile
        compiled = res["parts"][f"new compiled (aot_eager, {variant}) vs eager"]
        assert "error" not in compiled, compiled
        assert len(compiled["first_steps_s"]) == len(compiled["warm_first_steps_s"]) == 3 and compiled["compiled_s"] > 0
        assert compiled["graphs"] == graphs, variant
    report = (out / "gpu_step.md").read_text()
    assert "new / old step time: **" in report and "compiled / eager **" in report
    assert not list(out.glob("*.pt"))  # the batches stay out of the report folder
