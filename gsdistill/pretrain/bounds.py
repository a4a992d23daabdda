"""``views.max_spans``: what it cuts, said at start, and how high it may go.

Every batch is padded to ``views.max_spans`` text rows and box rows per page (``views.fixed_shapes``), and a
page's spans and boxes past it are not used. So the bound has an upper limit that fits memory
(:func:`check_max_spans`, at start, one line naming the limit and why), and a run counts what it cuts
(:func:`cut_at_max_spans`): pages with more spans or boxes than the bound and the spans and boxes left
out, printed in the run's data line and written to ``history.jsonl``. The counts come from the
manifest's per-page histograms (``pages_by_span_count``, ``pages_by_box_count``, written by the build);
a manifest without them (an older build) has its shards' page records read instead (images skipped).
"""
from __future__ import annotations

import json
import tarfile
from collections import Counter
from pathlib import Path

from gsdistill.config import ConfigError

# no real page comes near it (dense arXiv pages hold a few hundred spans); above it, padding is all waste
MAX_SPANS_LIMIT = 4096
# a batch's padded text rows (sem_emb + geom_emb, float32) may take at most this much host memory, before
# the DataLoader's copies, pinned buffers and the model's activations over them
TEXT_ROWS_BYTES = 2 << 30


def max_spans_limit(batch_size: int, text_dim: int) -> int:
    """The highest ``views.max_spans`` for a batch of ``batch_size`` pages with ``text_dim``-wide text rows."""
    per_span = 2 * text_dim * 4 * max(1, batch_size)
    return max(1, min(MAX_SPANS_LIMIT, TEXT_ROWS_BYTES // per_span))


def check_max_spans(cfg) -> None:
    """ConfigError when ``views.max_spans`` is above :func:`max_spans_limit` for the run's batch."""
    spans, batch = int(cfg["views"]["max_spans"]), int(cfg["optim"]["batch_size"])
    dim = int(cfg["model"]["text_dim"])
    limit = max_spans_limit(batch, dim)
    if spans > limit:
        need = spans * batch * 2 * dim * 4
        raise ConfigError(f"views.max_spans={spans} is above the maximum {limit} for optim.batch_size={batch}: "
                          f"every batch is padded to it ({batch} pages x {spans} spans x 2 rows x {dim} floats = "
                          f"{need / 2**30:.1f} GiB of text rows alone; the limit keeps them under "
                          f"{TEXT_ROWS_BYTES >> 30} GiB, and real pages hold a few hundred spans at most)")


def _histograms(folder: Path, manifest: dict) -> tuple[Counter, Counter]:
    """Pages per span count and per box count of a shard folder."""
    spans, boxes = manifest.get("pages_by_span_count"), manifest.get("pages_by_box_count")
    pages = int(manifest.get("pages", -1))
    if isinstance(spans, dict) and isinstance(boxes, dict) and sum(spans.values()) == pages == sum(boxes.values()):
        return Counter({int(k): v for k, v in spans.items()}), Counter({int(k): v for k, v in boxes.items()})
    spans, boxes = Counter(), Counter()
    for entry in manifest.get("shards", []):  # an older manifest: read the page records (images seeked over)
        with tarfile.open(folder / entry["name"], mode="r:") as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".json"):
                    page = json.loads(tar.extractfile(member).read())
                    spans[len(page.get("spans") or [])] += 1
                    boxes[len(page.get("boxes") or [])] += 1
    return spans, boxes


def cut_at_max_spans(folder: str | Path, bound: int) -> dict:
    """What ``views.max_spans=bound`` leaves out of the shard folder's pages (see the module doc)."""
    from gsdistill.tuples.store.reader import read_manifest
    folder = Path(folder)
    manifest = read_manifest(folder)
    spans, boxes = _histograms(folder, manifest)
    return {"views.max_spans": int(bound), "pages": int(manifest.get("pages", sum(spans.values()))),
            "pages_over_spans": sum(n for c, n in spans.items() if c > bound),
            "spans_cut": sum((c - bound) * n for c, n in spans.items() if c > bound),
            "pages_over_boxes": sum(n for c, n in boxes.items() if c > bound),
            "boxes_cut": sum((c - bound) * n for c, n in boxes.items() if c > bound)}


def describe_cut(cut: dict) -> str:
    """``views.max_spans=32 cuts 41 spans on 3 pages and no boxes (of 64 pages)``."""
    def part(count: int, pages: int, what: str) -> str:
        return f"{count} {what} on {pages} page{'s' if pages != 1 else ''}" if count else f"no {what}"
    return (f"views.max_spans={cut['views.max_spans']} cuts {part(cut['spans_cut'], cut['pages_over_spans'], 'spans')} "
            f"and {part(cut['boxes_cut'], cut['pages_over_boxes'], 'boxes')} (of {cut['pages']} pages)")
