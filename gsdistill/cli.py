"""The ``gsdistill`` command: one sub-command per stage, each implemented in its own package.

A newcomer reaches any stage in one hop from this table. Each target module exposes
``main(argv: list[str]) -> int`` with its own argparse parser; it is imported only when its
sub-command runs, so ``gsdistill retriever ...`` never imports Ultralytics or DeepSpeed.
"""
from __future__ import annotations

import importlib
import os
import re
import sys

# sub-command -> (module, one-line help)
STAGES: dict[str, tuple[str, str]] = {
    # gsdistill.tuples.cli parses it and builds; gsdistill.embed.cli hands the text encoder in for `embed`
    "tuples": ("gsdistill.embed.cli", "build page-tuple shards (pdf, images, coco, docbank, synthetic), embed their texts"),
    "pretrain": ("gsdistill.pretrain.cli", "pretrain a ViT with the GSDistill objective (DeepSpeed or plain PyTorch)"),
    "export": ("gsdistill.pretrain.export_cli", "export a pretrained backbone as safetensors + config"),
    "detect": ("gsdistill.detect.cli", "YOLOv10 layout detection on the frozen backbone: export, train, val, predict"),
    "eval": ("gsdistill.eval.cli", "crop-subsampled page retrieval evaluation"),
    "ablate": ("gsdistill.pipelines.ablate", "run the paper's Table 3 / A1 ablations end to end"),
    "retriever": ("gsdistill.retriever.cli", "train and evaluate text dense retrievers with the shared loss core"),
    "demo": ("gsdistill.pipelines.demo", "the whole pipeline on the embedded synthetic data (or --pdfs DIR)"),
}


def _usage() -> str:
    width = max(len(k) for k in STAGES)
    lines = ["usage: gsdistill <command> [args...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in STAGES.items()]
    lines += ["", "Run 'gsdistill <command> --help' for a command's options."]
    return "\n".join(lines)


def take_local_rank(argv: list[str]) -> list[str]:
    """``argv`` without the ``--local_rank=K`` (or ``--local-rank K``) the ``deepspeed`` launcher puts
    before the command name (``python -m gsdistill.cli --local_rank=K pretrain ...``); ``K`` goes to
    ``LOCAL_RANK`` unless the launcher set it there already, which is where every stage reads it."""
    argv = list(argv)
    while argv:
        m = re.fullmatch(r"--local[_-]rank(?:=(\d+))?", argv[0])
        if m is None:
            break
        if m.group(1) is None and len(argv) > 1 and argv[1].isdigit():
            value, argv = argv[1], argv[2:]
        elif m.group(1) is not None:
            value, argv = m.group(1), argv[1:]
        else:
            break
        os.environ.setdefault("LOCAL_RANK", value)
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = take_local_rank(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from gsdistill import __version__
        print(f"gsdistill {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in STAGES:
        import difflib
        hint = difflib.get_close_matches(name, STAGES, n=1)
        print(f"gsdistill: unknown command '{name}'" + (f"; did you mean '{hint[0]}'?" if hint else ""),
              file=sys.stderr)
        print(_usage(), file=sys.stderr)
        return 2
    from gsdistill.config import ConfigError
    from gsdistill.errors import GsdistillError
    # one handler for every stage: the project's own errors (bad config values, missing, truncated
    # or unfit files, bad data) are one line naming the key or file, exit code 2, no traceback
    try:
        module = importlib.import_module(STAGES[name][0])
        return int(module.main(rest) or 0)
    except ConfigError as e:
        print(f"gsdistill {name}: config error: {_one_line(e)}", file=sys.stderr)
        return 2
    except GsdistillError as e:
        print(f"gsdistill {name}: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside a training loop (which says more itself): one line, no traceback
        from gsdistill.errors import _ignore_signals
        _ignore_signals()  # a second Ctrl-C while this process exits: no traceback either
        print(f"gsdistill {name}: interrupted; run the same command again to resume or redo it", file=sys.stderr)
        return 130


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


if __name__ == "__main__":
    sys.exit(main())
