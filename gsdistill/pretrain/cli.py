"""``gsdistill pretrain [CONFIG] [key=value ...]``: pretrain with the GSDistill objective.

CONFIG is an experiment file (a path, or a name in configs/pretrain/, e.g. ``mpcl_dual``); with
none, the defaults pretrain a tiny ViT on synthetic pages. ``train.resume=RUN_DIR`` continues a run
from its checkpoint's own config; CONFIG and key=value overrides apply on top (the run lists them and
records them in RUN_DIR/history.jsonl; a change to what a step is, e.g. optim.batch_size or model.*,
needs train.resume_changes=allow). Multi-process: launch the same command
with ``torchrun --nproc_per_node N -m gsdistill.cli pretrain ...`` (or ``deepspeed``).

A run folder belongs to one run: ``--run-dir`` holding an earlier run, or files gsdistill did not
write, is refused (resume it, or pick another folder) unless ``--overwrite``, which removes what
gsdistill wrote there (by the folder's record ``.gsdistill-files``: checkpoints/, metrics.csv, tb/,
plots/, backbone/, config.yaml, history.jsonl, data/, profile/) and nothing else: a file of yours
stays, even inside those folders. A folder holding the experiment file or the data is refused,
``--overwrite`` or not. A second process writing the same folder is refused with the PID of the one
that holds it.
"""
from __future__ import annotations

import argparse



def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gsdistill pretrain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("items", nargs="*", metavar="CONFIG|key=value",
                        help="optional experiment config first, then key=value overrides")
    parser.add_argument("--run-dir", default=None, help="exact run folder (default: train.run_dir/<timestamp>)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run in --run-dir: remove what gsdistill wrote there (never "
                             "another file, never through a link), then start afresh")
    # the deepspeed launcher appends --local_rank=N; the rank is read from LOCAL_RANK instead
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_intermixed_args(argv)  # options may come between the key=value items
    overrides = [a for a in args.items if "=" in a]
    configs = [a for a in args.items if "=" not in a]
    if len(configs) > 1:
        parser.error(f"one experiment config at most, got {configs}")

    from gsdistill.errors import run_training_command
    from gsdistill.pretrain.run import resume_config, run_pretraining
    # on resume: the checkpoint's own config, the experiment file and the overrides on top (the
    # changes are listed when the run starts); project errors are handled by gsdistill.cli
    cfg, _, _ = resume_config(configs[0] if configs else None, overrides)
    from gsdistill.config import experiment_files
    config_files = experiment_files("pretrain", configs[0] if configs else None)
    from gsdistill.threads import apply_threads
    apply_threads(cfg.threads, int(cfg.data.num_workers))

    def run() -> int:
        print(f"run dir: {run_pretraining(cfg, args.run_dir, overwrite=args.overwrite, config_files=config_files)}")
        return 0
    return run_training_command("gsdistill pretrain", run)
