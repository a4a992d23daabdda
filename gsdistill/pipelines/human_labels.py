"""The demo's detectors scored on pages with human layout labels (issue 21, item 6).

The demo trains its detection heads on labels that the PDF builder derives from the PDF itself.
Whether what they learned is layout, and not the builder's habits, shows on pages that people
labelled: the DocBank samples (arXiv pages, DocBank's 13 token classes grouped into regions and
mapped onto DocLayNet's classes by :mod:`gsdistill.tuples.sources.docbank`) and the PubLayNet examples
(PubMed pages, PubLayNet's 5 classes). Both are converted to the demo's detection class set and
every trained detector (same weights, no further training) is scored on them; the pretrained and
random backbones are compared with the same paired document bootstrap as the held-out PDF pages.
"""
from __future__ import annotations

import json
from pathlib import Path

from gsdistill.tuples.labels import LABEL_SETS, PUBLAYNET_TO_DOCLAYNET

SETS = ("docbank_samples", "publaynet_examples")


def _publaynet_map(labels: str) -> dict | None:
    """PubLayNet's names -> the demo's class set (identity for ``publaynet``)."""
    if labels == "publaynet":
        return None
    return dict(PUBLAYNET_TO_DOCLAYNET)


def convert_sets(shared_data: str | Path, out: Path, labels: str) -> dict[str, Path]:
    """Data YAMLs (every page in ``val``) of the human-labelled sets found under ``shared_data``."""
    from gsdistill.detect.convert import coco_to_yolo, pages_to_yolo
    from gsdistill.tuples.sources.docbank import docbank_pages

    names, cmap = LABEL_SETS[labels]
    root, found = Path(shared_data), {}
    docbank = root / "docbank_samples"
    if docbank.is_dir():
        pages = list(docbank_pages(docbank))
        found["DocBank samples"] = pages_to_yolo(pages, out / "docbank", names=names, category_map=cmap,
                                                 val_docs={str(p["doc_id"]) for p in pages})
    pub = root / "publaynet_examples"
    if (pub / "samples.json").is_file():
        found["PubLayNet examples"] = coco_to_yolo(pub / "samples.json", pub / "images", out / "publaynet", names,
                                                   split="val", category_map=_publaynet_map(labels))
    return found


def _doc_of(sidecar: dict) -> dict[str, str]:
    """Image stem -> document: the converter's record, else the stem's prefix (``PMC123_00004`` -> ``PMC123``)."""
    return sidecar.get("doc_ids") or {s: s.rsplit("_", 1)[0] for s in sidecar["image_ids"]}


def score_on_human_labels(rows: list[dict], sets: dict[str, Path], cfg, out: Path, a: str, b: str,
                          n_boot: int = 1000, seed: int = 0) -> dict:
    """Every detector of ``rows`` (``compare_backbones``) on every set; ``b`` - ``a`` paired over documents.

    Returns ``{set name: {"rows": [{backbone, seed, map50, map50_95}], "bootstrap": paired result}}``.
    """
    from gsdistill.detect.evaluate import validate
    from gsdistill.detect.map_bootstrap import paired_map_bootstrap

    result = {}
    for name, data_yaml in sets.items():
        vcfg = cfg.copy()
        vcfg.project = str(out / "val" / Path(data_yaml).parent.name)
        vcfg.data_check.allow_empty_labels = True
        scored, preds = [], {}
        for r in rows:
            rep = validate(Path(r["run_dir"]) / "weights" / "last.pt", data_yaml, cfg=vcfg)
            pred_file = Path(rep["save_dir"]) / "predictions.json"
            preds.setdefault(r["backbone"], []).append(json.loads(pred_file.read_text()) if pred_file.is_file() else [])
            scored.append({"backbone": r["backbone"], "seed": r["seed"], "map50": rep["coco_mAP50"],
                           "map50_95": rep["coco_mAP50-95"]})
        sidecar = json.loads((Path(data_yaml).parent / "coco_eval.json").read_text())["val"]
        boot = None
        if a in preds and b in preds:
            boot = {"a": a, "b": b, **paired_map_bootstrap(preds[a], preds[b], sidecar, doc_of=_doc_of(sidecar),
                                                           n_boot=n_boot, seed=seed)}
        result[name] = {"rows": scored, "bootstrap": boot, "images": len(sidecar["image_ids"])}
    return result
