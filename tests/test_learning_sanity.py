"""The learning path learns: alignment only, 16 fixed synthetic pages, no augmentation (issue 11).

After a short real training run (full-page views, cached all-MiniLM-L6-v2 embeddings, both heads),
each training page must be found from its own texts, through each head, for >= 90% of the pages
(chance: 1/16). Any future break of the path data -> views -> model -> losses -> optimizer (a
detached head, a wrong positive mask, a sign error, a frozen parameter) fails this test.
"""
from __future__ import annotations

import pytest
import torch

from gsdistill.config import load_config
from gsdistill.tuples.store.reader import read_pages
from gsdistill.tuples.store.writer import write_shards
from gsdistill.tuples.sources.synthetic import generate_pages
from gsdistill.models.text_encoder import DEFAULT_ENCODER, TextEncoder
from gsdistill.tuples.embedding.stage import embed_shards
from gsdistill.tuples.store.text_cache import open_embeddings
from gsdistill.views.multicrop import MultiCropViews, collate_pretrain
from gsdistill.eval.head_retrieval import head_retrieval
from gsdistill.pretrain.checkpoint import load_pretrained
from gsdistill.pretrain.data_stream import FixedBatches
from gsdistill.pretrain.run import run_pretraining

SIZE, PAGES = 64, 16
# the demo's heads: per-span MPCL on the semantic head, the page's mean descriptor on the geometric one
ALIGN_ONLY = ["objective.distill=false", "objective.ibot=false", "objective.koleo=false", "objective.geom_target=mean",
              "objective.symmetric=true",
              f"views.global_size={SIZE}", "views.n_global=1", "views.n_local=0", f"model.backbone.img_size={SIZE}",
              f"optim.batch_size={PAGES}", "optim.steps=120", "optim.warmup_steps=10", "optim.lr=1e-3",
              "train.log_every=20", "train.ckpt_every=1000", "train.progress=false", "train.tensorboard=false",
              "train.plots=false"]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sanity") / "shards"
    write_shards(generate_pages(PAGES, seed=3, width=256, height=320), folder, total=PAGES)
    embed_shards(folder, TextEncoder, DEFAULT_ENCODER, progress=False)
    return list(read_pages(folder, embeddings=open_embeddings(folder, required=True)))


def full_page_batch(pages: list[dict]) -> dict:
    """One collated batch: each page once, whole (scale 1), no photometric change, no mask."""
    views = MultiCropViews(global_size=SIZE, n_global=1, n_local=0, global_scale=(1.0, 1.0), mask_prob=0.0,
                           color_jitter=0.0, blur_prob=0.0, seed=0)
    return collate_pretrain([views(p) for p in pages])


def test_alignment_fits_sixteen_fixed_pages(pages, tmp_path):
    torch.manual_seed(0)
    cfg = load_config("pretrain", None, ALIGN_ONLY)
    batch = full_page_batch(pages)
    run = run_pretraining(cfg, tmp_path / "run", lambda rank, world: FixedBatches([batch], rank, world))
    model = load_pretrained(run)
    for head, k in (("geom", None), ("sem", None)):
        r = head_retrieval(model, pages, head, SIZE, k=k)
        assert r["n_pages"] == PAGES
        assert r["acc1"] >= 0.9, (head, r["acc1"])
    untrained = load_pretrained(run)  # the same architecture before any step is near chance
    torch.manual_seed(1)
    from gsdistill.models.gsdistill_model import GSDistill
    untrained.load_state_dict(GSDistill(cfg).state_dict())
    assert head_retrieval(untrained, pages, "geom", SIZE)["acc1"] <= 0.4
