"""``gsdistill export RUN_DIR OUT_DIR [--weights student|teacher]``: a pretrained backbone as safetensors + json.

``--weights teacher`` exports the EMA teacher's backbone (DINOv2 evaluates the teacher) instead of the
student's, the default and what every pretraining run writes to ``RUN_DIR/backbone`` (on the long real-page
benchmark the teacher scored -0.7 [-2.2, +0.5] mAP@50 against the student: docs/learning.md).

RUN_DIR may be a run dir (its latest checkpoint is used) or one checkpoint folder; a damaged
checkpoint is an error naming the file and the newest intact checkpoint before it, a backbone with
NaN/inf weights is not exported. OUT_DIR is loadable with ``gsdistill.models.backbone.load_backbone``
and buildable by ``timm.create_model``; one that holds a backbone already, or files gsdistill did not
write, is refused unless ``--overwrite`` (which replaces backbone.safetensors and backbone.json
only, and only when gsdistill wrote them), and it is held while written: a second export into it is
refused with the PID of the first.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gsdistill export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="pretraining run dir or checkpoint folder")
    parser.add_argument("out_dir", help="folder to write backbone.safetensors + backbone.json into")
    parser.add_argument("--weights", choices=("student", "teacher"), default="student",
                        help="which network's backbone: the student (default) or the EMA teacher")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the backbone OUT_DIR holds already (its two files, nothing else)")
    args = parser.parse_args(argv)

    from gsdistill.errors import GsdistillError
    from gsdistill.models.backbone import META, WEIGHTS
    from gsdistill.output_folder import OutputConflict, check_claim, check_output_dir, lock_folder, remove_earlier
    from gsdistill.output_manifest import Layout
    from gsdistill.pretrain import checkpoint
    from gsdistill.pretrain.run import backbone_state, export_backbone
    from gsdistill.tuples.store.folder import removed_if_left_empty
    ckpt = checkpoint.resolve_checkpoint(args.run_dir)
    try:  # a damaged checkpoint is named, with the intact one to export instead (never silently)
        checkpoint.verify(ckpt)
    except GsdistillError as e:
        raise type(e)(f"{e}{checkpoint.intact_hint(ckpt)}") from None
    out = check_output_dir(args.out_dir, "OUT_DIR", [("checkpoint", ckpt)])
    cfg = checkpoint.read_config(ckpt)
    state = checkpoint.read_model(ckpt)
    backbone_state(state, args.weights, str(ckpt))  # refused (NaN/inf, no teacher) before OUT_DIR is made
    layout = Layout("gsdistill export", (WEIGHTS, META, WEIGHTS + ".tmp"), (WEIGHTS, META, WEIGHTS + ".tmp"),
                    (WEIGHTS, META), ((WEIGHTS, META),))
    with removed_if_left_empty(out), lock_folder(out):  # a failed write (a full disk) leaves no empty OUT_DIR
        inv = check_claim(out, "OUT_DIR", layout, args.overwrite, fresh=False)
        held = inv.ours_matching(layout)
        if held and not args.overwrite:
            raise OutputConflict(f"OUT_DIR {out}: holds a backbone already ({', '.join(held)}); choose another "
                                 "folder, or pass --overwrite to replace it")
        check_claim(out, "OUT_DIR", layout, args.overwrite)
        if args.overwrite:
            remove_earlier(out, layout, under=[WEIGHTS, META, WEIGHTS + ".tmp"])
        out = export_backbone(state, cfg, Path(out), source=str(ckpt), weights=args.weights)
    print(f"exported the {args.weights} backbone of {ckpt} -> {out}")
    return 0
