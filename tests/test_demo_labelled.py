"""`gsdistill demo --coco FILE --images DIR` (issue 64): a user's labelled pages, pretrained on as unlabelled
scans, their boxes for the detection heads alone. A tiny fixture (synthetic pages saved as scans, a COCO of
their boxes under sentinel category names) runs every stage; the sentinels are looked for in everything
pretraining reads."""
from __future__ import annotations

import json
import tarfile

import pytest

from gsdistill.config import load_config
from gsdistill.pipelines import demo
from gsdistill.tuples.sources.images import tesseract_available

SENTINEL = "Zqxsentinelzone"  # a category name no OCR, descriptor or default could produce
SMOKE = ["data.eval_fraction=0.5", "data.retrieval_train_pages=4", "labelled.min_class_boxes=3", "labelled.workers=1",
         "labelled.ocr_long_side=800", "labelled.ocr_min_width=480", "labelled.detect_long_side=256",
         "labelled.bootstrap_min_docs=3"]  # 2 held-out documents: pages resampled within each


def labelled_fixture(root, docs=4, pages=2):
    """Scans of ``docs`` documents (``pages`` each, one PNG a page) and a COCO of their layout boxes whose
    categories are sentinel strings, each image naming its document in ``source_book``."""
    from gsdistill.tuples.sources.synthetic import render_page
    images_dir = root / "scans"
    images_dir.mkdir(parents=True)
    coco = {"images": [], "annotations": [], "categories": []}
    cats = {}
    for d in range(docs):
        for k in range(pages):
            page = render_page(7, d * 4 + k, width=480, height=600, text_scale=1.5)
            name = f"book{d}_{k:04d}.png"
            page["image"].save(images_dir / name)
            img_id = len(coco["images"]) + 1
            coco["images"].append({"id": img_id, "file_name": name, "width": 480, "height": 600,
                                   "source_book": f"book{d}"})
            for b in page["boxes"]:
                cid = cats.setdefault(f"{SENTINEL}{b['category'].replace('-', '')}:part", len(cats) + 1)
                x0, y0, x1, y1 = b["bbox"]
                coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": img_id, "category_id": cid,
                                            "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)})
    coco["categories"] = [{"id": i, "name": n} for n, i in cats.items()]
    (root / "coco.json").write_text(json.dumps(coco))
    return root / "coco.json", images_dir


def test_labelled_flags_pick_the_labelled_recipe(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda cfg, **_: seen.update(cfg=cfg) or tmp_path / "report.md")
    assert demo.main(["--coco", "c.json", "--images", "imgs", "--doc-key", "book", "--class-map", "coarse",
                      "--workers", "2"]) == 0
    lab = seen["cfg"].labelled
    assert (lab.coco, lab.images, lab.doc_key, lab.class_map, lab.workers) == ("c.json", "imgs", "book", "coarse", 2)
    assert list(seen["cfg"].detect_label_fractions) == [0.2]  # the low-label row of configs/demo/labelled.yaml
    demo.main(["--release", "r", "--dataset", "doclaynet", "--size", "smoke"])
    assert seen["cfg"].labelled.release == "r" and seen["cfg"].labelled.dataset == "doclaynet"


@pytest.mark.parametrize("args, words", [
    (["--coco", "{root}/missing.json", "--images", "{root}"], "no such COCO file"),
    (["--coco", "{root}/bad.json", "--images", "{root}"], "cannot read COCO json"),
    (["--coco", "{root}/coco.json"], "--images DIR"),
    (["--coco", "{root}/coco.json", "--images", "{root}/scans", "--doc-key", "volume"], "no 'volume' field"),
    (["--coco", "{root}/coco.json", "--images", "{root}/scans", "--class-map", "{root}/map.yaml"], "not a category"),
    (["--release", "{root}", "--dataset", "doclaynet"], "no doclaynet split file"),
])
def test_bad_labelled_input_is_one_line_exit_2(tmp_path, capsys, args, words):
    from gsdistill.cli import main
    labelled_fixture(tmp_path, docs=2, pages=1)
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "map.yaml").write_text("NoSuchClass: Other\n")
    argv = ["demo", *[a.format(root=tmp_path) for a in args], "--size", "smoke", "--out", str(tmp_path / "out"),
            f"labelled.cache_dir={tmp_path / 'cache'}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_a_doclaynet_release_joins_its_split_files_and_splits_by_doc_name(tmp_path):
    from PIL import Image

    from gsdistill.pipelines.labelled_pages import read_inputs
    (tmp_path / "COCO").mkdir()
    (tmp_path / "PNG").mkdir()
    for split, docs in (("train", ["a", "b"]), ("val", ["c"])):
        coco = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "Text"}]}
        for d in docs:
            for k in range(2):
                name = f"{split}{d}{k}.png"
                Image.new("RGB", (60, 80), "white").save(tmp_path / "PNG" / name)
                coco["images"].append({"id": len(coco["images"]) + 1, "file_name": name, "width": 60, "height": 80,
                                       "doc_name": f"{d}.pdf"})
                coco["annotations"].append({"id": k, "image_id": len(coco["images"]), "category_id": 1, "bbox": [1, 1, 9, 9]})
        (tmp_path / "COCO" / f"{split}.json").write_text(json.dumps(coco))
    cfg = load_config("demo", "smoke", [f"labelled.release={tmp_path}", "labelled.dataset=doclaynet", "labelled.min_class_boxes=1"])
    r = read_inputs(cfg)
    assert r["how"] == "the images' `doc_name` field" and r["kept_docs"] == {"a.pdf", "b.pdf", "c.pdf"}
    assert len(r["images"]) == 6 and r["classes"] == ["Text"]


def test_documents_default_to_the_file_name_prefix():
    from gsdistill.pipelines.labelled_input import documents
    images = [{"name": n, "entry": {}} for n in ("PMC1_00001.jpg", "PMC1_00002.jpg", "PMC2_00001.jpg")]
    how, doc_of = documents(images, None)
    assert "prefix before its last `_`" in how and doc_of == {"PMC1_00001.jpg": "PMC1", "PMC1_00002.jpg": "PMC1",
                                                               "PMC2_00001.jpg": "PMC2"}


def test_ocr_by_document_counts_words_and_greek_letters():
    from gsdistill.pipelines.demo_report_labelled import ocr_by_document
    pages = [{"id": "a1", "doc_id": "a", "spans": [{"text": "μῆνιν ἄειδε θεὰ"}, {"text": "Zorn"}]},
             {"id": "b1", "doc_id": "b", "spans": [{"text": "Über alles"}]}]
    rows = ocr_by_document(pages)
    assert rows[2] == "| a | 1 | 4 | 76.5 % | 0.0 % |" and rows[3] == "| b | 1 | 2 | 0.0 % | 11.1 % |"


def test_class_maps_and_rare_classes():
    from gsdistill.pipelines.labelled_input import class_map, target_classes
    names = ["MainZone:commentary", "MainZone:primaryText", "NumberingZone:pageNumber", "TitlePageZone"]
    coarse = class_map("coarse", names)
    assert coarse == {"MainZone:commentary": "MainZone", "MainZone:primaryText": "MainZone",
                      "NumberingZone:pageNumber": "NumberingZone", "TitlePageZone": "TitlePageZone"}
    images = [{"boxes": [("MainZone:commentary", [0, 0, 1, 1])] * 3 + [("NumberingZone:pageNumber", [0, 0, 1, 1])] * 2
               + [("TitlePageZone", [0, 0, 1, 1])] + [("MainZone:primaryText", [0, 0, 1, 1])]}]
    classes, info = target_classes(images, coarse, min_boxes=2)
    assert classes == ["MainZone", "NumberingZone"] and info["dropped"] == {"TitlePageZone": 1}
    assert info["merged"]["MainZone"] == ["MainZone:commentary", "MainZone:primaryText"]


def test_pages_are_downscaled_for_pretraining_with_their_boxes():
    from PIL import Image

    from gsdistill.pipelines.labelled_pages import downscaled
    page = {"id": "p", "image": Image.new("RGB", (2000, 3000), "white"), "width": 2000, "height": 3000,
            "spans": [{"text": "a", "bbox": [300.0, 600.0, 900.0, 1200.0], "category": "Text"}],
            "boxes": [{"category": "Text", "bbox": [300.0, 600.0, 900.0, 1200.0]}]}
    small = downscaled(page, 1000)
    assert small["image"].size == (667, 1000) and (small["width"], small["height"]) == (667, 1000)
    assert small["spans"][0]["bbox"] == pytest.approx([100, 200, 300, 400]) == small["boxes"][0]["bbox"]
    assert page["spans"][0]["bbox"][0] == 300.0 and downscaled(page, None) is page


def _texts_pretraining_reads(folder) -> str:
    """Every text pretraining can read of a shard folder: page records, manifests, the text cache's meta."""
    parts = []
    for f in folder.rglob("*"):
        if f.suffix == ".tar":
            with tarfile.open(f) as tar:
                parts += [tar.extractfile(m).read().decode("utf-8", "replace") for m in tar if m.name.endswith(".json")]
        elif f.suffix in (".json", ".csv", ".yaml"):
            parts.append(f.read_text())
    return "\n".join(parts)


@pytest.fixture(scope="module")
def labelled_demo(tmp_path_factory):
    if not tesseract_available():
        pytest.skip("OCR needs the 'tesseract' program (apt install tesseract-ocr)")
    root = tmp_path_factory.mktemp("labelled")
    coco, images = labelled_fixture(root)
    # 4 training pages: the smoke recipe's pretraining batch halved
    pretrain = [*load_config("demo", "smoke").pretrain, "optim.batch_size=4"]
    cfg = load_config("demo", "smoke", [*SMOKE, f"labelled.coco={coco}", f"labelled.images={images}",
                                        f"labelled.cache_dir={root / 'cache'}", f"out_dir={root / 'out'}",
                                        f"pretrain=[{','.join(pretrain)}]"])
    return root, cfg, demo.run_demo(cfg)


def test_labelled_demo_runs_every_stage(labelled_demo):
    root, cfg, report = labelled_demo
    out = root / "out"
    res = json.loads((out / "results.json").read_text())
    lab = res["data"]["labelled"]
    assert lab["documents_by"] == "the images' `source_book` field"
    assert len(lab["held_docs"]) == 2 and not set(lab["held_docs"]) & set(lab["train_docs"])
    # the held-out documents' pages are the detection val split, whole
    val = json.loads((out / "detect" / "labelled" / "data" / "coco" / "val.json").read_text())
    assert {im["file_name"].split("_")[0] for im in val["images"]} == set(lab["held_docs"])
    assert {r["backbone"] for r in res["detect"]["rows"]} == {"pretrained", "random backbone"}
    assert res["detect"]["labels"] == lab["classes"] and all(c.startswith(SENTINEL) for c in lab["classes"])
    assert res["detect_budgets"][0]["fraction"] == 0.5
    # fewer held-out documents than bootstrap_min_docs: pages are resampled within each held-out document
    sidecar = json.loads((out / "detect" / "labelled" / "data" / "coco_eval.json").read_text())["val"]
    assert "doc_ids" not in sidecar and set(sidecar["strata"].values()) == set(lab["held_docs"])
    boot = res["detect"]["paired"]["backbone"]
    assert (boot["unit"], boot["n_docs"], boot["n_strata"]) == ("pages", 4, 2)
    text = report.read_text()
    assert "## 1b. The labelled pages" in text and "held out, 2 of 4 documents" in text
    assert "their 4 pages, drawn within each of their 2 documents (stratified)" in text
    assert "What OCR read of each document" in text and "| book0 | 2 |" in text
    # the page's scale in pretraining's views against the detector's (the smoke recipe: 64 px views, 128 px pages)
    assert "Scale: the detectors read a page at a long side of 128 px; pretraining's global views (64 px," in text
    for d in lab["held_docs"]:
        assert d in text


def test_no_annotation_reaches_what_pretraining_reads(labelled_demo):
    root, cfg, _ = labelled_demo
    cache = root / "cache"
    assert list(cache.rglob("shard-*.tar")), "the OCR page tuples are cached"
    for folder in (root / "out" / "data" / "train", root / "out" / "data" / "eval", *cache.rglob("pages")):
        assert SENTINEL.lower() not in _texts_pretraining_reads(folder).lower(), folder
    # descriptors and the views' inputs: what the pretraining stream makes of a page
    from gsdistill.tuples.descriptors import box_texts
    from gsdistill.tuples.store.reader import read_pages
    for page in read_pages(root / "out" / "data" / "train"):
        assert not any(SENTINEL.lower() in t.lower() for t in box_texts(page))
        assert {b["category"] for b in page["boxes"]} <= {"Text", "Section-header", "Caption", "List-item"}


def test_second_run_reuses_the_cached_ocr(labelled_demo):
    root, cfg, _ = labelled_demo
    from gsdistill.pipelines.labelled_pages import build_labelled_split
    cfg2 = load_config("demo", "smoke", [*SMOKE, f"labelled.coco={cfg.labelled.coco}", "seed=3", "labelled.class_map=coarse",
                                         f"labelled.images={cfg.labelled.images}", f"labelled.cache_dir={root / 'cache'}"])
    cfg2.labelled.bootstrap_min_docs = 2
    _, _, info = build_labelled_split(cfg2, root / "second", readers=1)
    assert info["labelled"]["ocr"]["cached"]
    sidecar = json.loads((root / "second" / "detect" / "labelled" / "data" / "coco_eval.json").read_text())["val"]
    assert "strata" not in sidecar and len(set(sidecar["doc_ids"].values())) == 2  # enough documents: resampled whole
    assert info["labelled"]["classes"] and all(":" not in c for c in info["labelled"]["classes"])


@pytest.mark.slow
def test_labelled_demo_on_hand_labelled_scans(shared_data, tmp_path):
    """The real set (GT4HistComment: 8 books of hand-labelled scans) at toy size: 2 pages of each book, held
    out by whole books, its six coarse zones; tools/experiments/labelled_pages_bench.sh is the full run."""
    if not tesseract_available():
        pytest.skip("OCR needs the 'tesseract' program (apt install tesseract-ocr)")
    src = shared_data / "gt4histcomment_layout"
    if not (src / "coco.json").is_file():
        pytest.skip(f"no GT4HistComment labelled pages at {src}")
    coco = json.loads((src / "coco.json").read_text())
    keep, per_book = [], {}
    for im in coco["images"]:
        if per_book.setdefault(im["source_book"], 0) < 2:
            per_book[im["source_book"]] += 1
            keep.append(im)
    ids = {im["id"] for im in keep}
    small = {**coco, "images": keep, "annotations": [a for a in coco["annotations"] if a["image_id"] in ids]}
    (tmp_path / "coco.json").write_text(json.dumps(small))
    pretrain = [*load_config("demo", "smoke").pretrain, "optim.batch_size=4"]
    cfg = load_config("demo", "smoke", [*SMOKE, f"labelled.coco={tmp_path / 'coco.json'}", f"labelled.images={src / 'images'}",
                                        "labelled.class_map=coarse", "labelled.min_class_boxes=1", "data.eval_fraction=0.3",
                                        f"labelled.cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / 'out'}",
                                        f"pretrain=[{','.join(pretrain)}]"])
    report = demo.run_demo(cfg).read_text()
    lab = json.loads((tmp_path / "out" / "results.json").read_text())["data"]["labelled"]
    assert lab["documents_by"] == "the images' `source_book` field" and len(lab["documents"]) == 8
    assert len(lab["held_docs"]) == 2 and all(f"{d} (2 pages)" in report for d in lab["held_docs"])
    assert set(lab["classes"]) <= {"NumberingZone", "MainZone", "RunningTitleZone", "MarginTextZone", "CustomZone",
                                   "TitlePageZone"}
