"""Here, before a GPU sitting: everything ``tools/gpu/lease.py`` needs there, in ``.gpu/``, and a check that
what travels fits (docs/gpu.md, "The lease").

1. ``../shared/gpu``'s ``on_device.sh``, ``restore_enc.py``, ``site.tar.xz`` and ``zstd-site.tar.xz`` copied into
   ``.gpu/`` (not ``py-spy`` nor the old measurements: 8 MB the lease does not use);
2. real pages built from ``--pdfs`` (pymupdf and tesseract are absent there), split by document into
   pretraining and held-out pages (``gsdistill.pipelines.demo_pdfs.build_pdf_split``: no document in both),
   packed into ``.gpu/lease/pages.tar.xz`` (``lease_pages.pack_bundle``: raw pixels in one xz stream);
3. the text height in the recipe's views, measured on these pages (``.gpu/lease/pages.json``);
4. what travels measured: the tracked tree, untracked files git does not ignore, and ``.gpu/`` (the one
   carried folder), against the 64 MiB a call may carry; more than ``--budget-mib`` minus ``--margin-mib``
   is refused (exit 2) with the sizes, so a sitting never starts with a copy that cannot travel.

    .venv/bin/python tools/gpu/lease_prepare.py [--max-pages N]     # the recipe's data section sizes the rest
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHARED_FILES = ("on_device.sh", "restore_enc.py", "site.tar.xz", "zstd-site.tar.xz")
MIB = 1 << 20
VIEW_SIZES = (112, 224, 448, 512)
ONE_LINE_PT = 15  # a Text block no taller than 15 pt is one line of body text (10-12 pt type)


def git_files(root: Path, *flags: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", *flags], cwd=root, capture_output=True, check=True).stdout
    return [root / p for p in out.decode().split("\0") if p]


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def travel_bytes(root: Path, carried: list[str]) -> dict[str, int]:
    """Bytes that go with a call to the device machine: the tracked files as they are in the working tree,
    untracked files git does not ignore, and each carried (ignored) folder."""
    tracked = sum(p.stat().st_size for p in git_files(root) if p.is_file() and not p.is_symlink())
    untracked = sum(p.stat().st_size for p in git_files(root, "--others", "--exclude-standard") if p.is_file())
    sizes = {"tracked tree": tracked, "untracked, not ignored": untracked}
    for name in carried:
        sizes[f"carried {name}/"] = folder_bytes(root / name) if (root / name).is_dir() else 0
    return sizes


def one_line_body_heights(pages: list[dict], size: int, dpi: int) -> float | None:
    """Median height, in pixels of a ``size`` whole-page view, of one-line Text blocks (body text)."""
    import numpy as np

    limit = ONE_LINE_PT * dpi / 72
    hs = [(s["bbox"][3] - s["bbox"][1]) * size / p["height"] for p in pages for s in p["spans"]
          if s.get("category") == "Text" and 0 < s["bbox"][3] - s["bbox"][1] <= limit]
    return float(np.median(hs)) if hs else None


def text_heights(data_dir: Path, dpi: int) -> dict[str, dict[str, float]]:
    """Per view size, the median one-line text heights in view pixels of every built page (the measure
    of docs/learning.md, "What the model sees", plus one-line body text)."""
    from gsdistill.pipelines.demo_report import text_height_in_view
    from gsdistill.tuples.store.reader import read_pages

    pages = [p for split in ("train", "eval") for p in read_pages(data_dir / split, decode_images=False)]
    out = {}
    for size in VIEW_SIZES:
        row = text_height_in_view(pages, size)
        body = one_line_body_heights(pages, size, dpi)
        out[str(size)] = {**row, **({"Text, one line": body} if body is not None else {})}
    return out


def copy_shared(shared: Path, gpu_dir: Path) -> None:
    gpu_dir.mkdir(parents=True, exist_ok=True)
    for name in SHARED_FILES:
        dst = gpu_dir / name
        if not dst.is_file() or dst.stat().st_size != (shared / name).stat().st_size:
            shutil.copy2(shared / name, dst)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pdfs", type=Path, default=Path("/usr/share/doc/texlive-doc"),
                    help="folder of PDFs (GSDISTILL_TEXLIVE_DOCS=1 bash tools/setup.sh installs the texlive ones)")
    ap.add_argument("--recipe", default="gpu_pdfs", help="configs/demo/ file whose data section sizes the pages")
    ap.add_argument("--max-pages", type=int, default=None, help="pages in all (default: the recipe's data.max_pdf_pages)")
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "gpu", help="the archives to carry")
    ap.add_argument("--gpu-dir", type=Path, default=ROOT / ".gpu", help="the carried folder")
    ap.add_argument("--work", type=Path, default=None, help="where the shards are built (default: a temporary folder)")
    ap.add_argument("--budget-mib", type=float, default=64.0)
    ap.add_argument("--margin-mib", type=float, default=2.0)
    args = ap.parse_args(argv)
    from gsdistill.config import load_config

    cfg = load_config("demo", args.recipe)
    d, max_pages = cfg.data, args.max_pages or int(cfg.data.max_pdf_pages)
    missing = [n for n in SHARED_FILES if not (args.shared / n).is_file()]
    if missing:
        print(f"lease_prepare: {args.shared} lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    if not args.pdfs.is_dir():
        print(f"lease_prepare: --pdfs {args.pdfs} is not a folder (GSDISTILL_TEXLIVE_DOCS=1 bash tools/setup.sh "
              "installs /usr/share/doc/texlive-doc)", file=sys.stderr)
        return 2
    from gsdistill.pipelines.demo_pdfs import build_pdf_split
    from lease_pages import pack_bundle

    copy_shared(args.shared, args.gpu_dir)
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        info = build_pdf_split(args.pdfs, work, int(d.pdf_dpi), max_pages, int(d.pages_per_pdf), float(d.eval_fraction),
                               int(cfg.seed))
        (args.gpu_dir / "lease").mkdir(parents=True, exist_ok=True)
        bundle = args.gpu_dir / "lease" / "pages.tar.xz"
        pack_bundle(work, bundle)
        heights = text_heights(work, int(d.pdf_dpi))
    meta = {"pdfs": str(args.pdfs), "recipe": args.recipe, "dpi": int(d.pdf_dpi), "seed": int(cfg.seed),
            "eval_fraction": float(d.eval_fraction),
            "splits": {k: {"pages": v["pages"], "documents": v["documents"]} for k, v in info.items() if k != "all PDF pages"},
            "bundle_bytes": bundle.stat().st_size, "text_height_px": heights,
            "built": time.strftime("%Y-%m-%d %H:%M"), "seconds": round(time.time() - start, 1)}
    (args.gpu_dir / "lease" / "pages.json").write_text(json.dumps(meta, indent=1) + "\n")
    for split, s in meta["splits"].items():
        print(f"{split}: {s['pages']} pages of {s['documents']} documents")
    print(f"bundle {bundle}: {meta['bundle_bytes'] / MIB:.2f} MiB ({meta['bundle_bytes'] / 1024 / sum(s['pages'] for s in meta['splits'].values()):.1f} KiB a page)")
    print("median one-line text height in a whole-page view, px:")
    for size, row in heights.items():
        print(f"  {size:>4} px: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()))
    return check_travel(ROOT, [args.gpu_dir.relative_to(ROOT).as_posix()] if args.gpu_dir.is_relative_to(ROOT)
                        else [], args.budget_mib, args.margin_mib, extra=0 if args.gpu_dir.is_relative_to(ROOT)
                        else folder_bytes(args.gpu_dir))


def check_travel(root: Path, carried: list[str], budget_mib: float, margin_mib: float, extra: int = 0) -> int:
    sizes = travel_bytes(root, carried)
    if extra:
        sizes["carried folder outside the tree"] = extra
    total = sum(sizes.values())
    print("what travels: " + ", ".join(f"{k} {v / MIB:.2f} MiB" for k, v in sizes.items())
          + f"; {total / MIB:.2f} MiB of {budget_mib:g} (margin {budget_mib - total / MIB:.2f} MiB)")
    if total > (budget_mib - margin_mib) * MIB:
        print(f"lease_prepare: {total / MIB:.2f} MiB would travel, over {budget_mib:g} MiB less a {margin_mib:g} MiB "
              "margin: fewer --max-pages", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
