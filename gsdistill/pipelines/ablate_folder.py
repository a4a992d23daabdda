"""An ablation's output folder: one results.csv holds rows measured at one scale."""
from __future__ import annotations

from pathlib import Path

from gsdistill.run_log import read_rows

from gsdistill.output_manifest import Layout

# what an ablation writes into out_dir (its runs' folders included)
ABLATION = Layout("gsdistill ablate", ("config.yaml", "results.csv", "table.md", "ablation.png", "pretrain", "detect",
                                       "detect_data", "retrieval_data"),
                  ("config.yaml", "results.csv", "table.md", "ablation.png", "pretrain/**", "detect/**",
                   "detect_data/**", "retrieval_data/**"), ("results.csv",), (("results.csv", "config.yaml"),))

# keys that may differ between runs adding rows to one results.csv (which rows, which seeds, the machine)
SAME_TABLE_FREE = ("rows", "seeds", "threads", "out_dir")


def check_same_scale(cfg, out_dir: Path, config_files: list[Path] = ()) -> None:
    """A results.csv holds rows of one scale: a run into a folder whose saved config differs in
    anything but the rows, seeds or threads would add rows measured otherwise to its table (refused,
    one line naming the changed keys). ``out_dir`` never holds what the ablation reads (the fixed
    detection set, the held-out pages, the experiment files ``config_files``), and a new ablation
    never starts in a folder holding files gsdistill did not write."""
    from gsdistill.config import to_dict
    from gsdistill.output_folder import OutputConflict, check_output_dir
    from gsdistill.run_history import config_changes, describe
    inputs = [(key, Path(str(value))) for key, value in (("detect_set.data", cfg.detect_set.data),
                                                          ("held_out.pages", cfg.held_out.pages)) if value]
    check_output_dir(out_dir, "out_dir", inputs + [("--config", Path(f)) for f in config_files])
    from gsdistill.output_folder import check_claim
    inv = check_claim(out_dir, "out_dir", ABLATION, overwrite=False, fresh=False)
    check_claim(out_dir, "out_dir", ABLATION, overwrite=False, flag=None,
                fresh="results.csv" not in inv.ours)  # a new ablation never starts among files of the user's
    saved = out_dir / "config.yaml"
    if not (saved.is_file() and _rows(out_dir / "results.csv")):
        return
    import yaml
    changes = config_changes(yaml.safe_load(saved.read_text()) or {}, to_dict(cfg), ignore=SAME_TABLE_FREE)
    if changes:
        raise OutputConflict(f"out_dir {out_dir}: its results.csv was measured with other settings ({describe(changes)}); "
                             "its rows would mix with these: choose another out_dir")


def _rows(path: Path) -> list[dict]:
    return read_rows(path) if path.is_file() else []
