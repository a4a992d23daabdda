"""Two `gsdistill demo` runs on the same pages (e.g. two code revisions): is B's pretrained backbone
worse at head-only detection than A's?

Both runs must hold the same held-out pages (the same data config and seed; checked on the
detection sidecar). Prints, for head-only detection on the pretrained backbone, each run's seed-mean
mAP@50 and mAP@[50:95] and the difference B - A with a 95% bootstrap interval over held-out
documents (``gsdistill.detect.map_bootstrap.paired_map_bootstrap``, every detection seed of each
run), and the same for the random-backbone control when both runs trained it, as a check that the
two runs' detection stages agree where the backbone is the same.

    python tools/experiments/compare_demo_runs.py RUN_A RUN_B [--json OUT]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from gsdistill.detect.map_bootstrap import paired_map_bootstrap


def predictions(run: Path, backbone: str) -> list[list[dict]]:
    rows = json.loads((run / "detect" / "rows.json").read_text())
    files = [Path(r["val_dir"]) / "predictions.json" for r in sorted(rows, key=lambda r: r["seed"])
             if r["backbone"] == backbone]
    return [json.loads(f.read_text()) for f in files if f.is_file()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sidecars = [json.loads((r / "detect" / "data" / "coco_eval.json").read_text())["val"] for r in (args.run_a, args.run_b)]
    if sidecars[0]["image_ids"] != sidecars[1]["image_ids"]:
        raise SystemExit("the two runs hold different held-out pages: compare runs of the same data config and seed")
    out = {}
    for backbone in ("pretrained", "random backbone"):
        a, b = predictions(args.run_a, backbone), predictions(args.run_b, backbone)
        if not a or not b:
            print(f"{backbone}: not in both runs")
            continue
        res = paired_map_bootstrap(a, b, sidecars[0], n_boot=args.n_boot)
        out[backbone] = res
        for key in ("map50", "map50_95"):
            m = res[key]
            mean_a, mean_b = sum(m["a"]) / len(m["a"]), sum(m["b"]) / len(m["b"])
            print(f"{backbone:<16} {key:<9} A {100 * mean_a:6.2f}  B {100 * mean_b:6.2f}  B - A {100 * m['diff']:+6.2f} "
                  f"[{100 * m['ci95'][0]:+.2f}, {100 * m['ci95'][1]:+.2f}]  ({len(m['a'])} / {len(m['b'])} seeds, "
                  f"{res['n_images']} pages, {res['n_docs']} documents)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
