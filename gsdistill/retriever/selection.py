"""Checkpoint selection on a dev split: the epoch whose weights score best on dev is the one kept.

With ``data.dev_split`` set, :func:`gsdistill.retriever.pipeline.train_and_evaluate` scores the model
on the dev queries after every epoch (nDCG@10 by default, with the frozen passage tower's cached
embeddings, or a re-encoded corpus when both towers train) and, after training, puts back the
weights of the best epoch (the first one on ties). The test split is evaluated only after that,
once, so nothing about test steers training or selection. With one epoch nothing is chosen, but
the dev score is still measured (it is what ranks losses or settings against each other on dev). The dev scores of every epoch go to
``summary.json`` (``selection``).
"""
from __future__ import annotations

import sys
import time

import torch

from gsdistill.retriever.data import RetrievalData
from gsdistill.retriever.evaluate import encode_corpus, evaluate_retriever
from gsdistill.retriever.model import DualEncoder


class EpochSelector:
    """``selector(epoch, model)`` after each epoch; ``selector.restore(model)`` after training."""

    def __init__(self, dev: RetrievalData, doc_emb: torch.Tensor | None, measure: str = "nDCG@10",
                 k: int = 1000, batch_size: int = 64, min_relevance: float = 1.0, progress: bool = False):
        self.dev, self.doc_emb, self.measure = dev, doc_emb, measure
        self.k, self.batch_size, self.min_relevance, self.progress = k, batch_size, min_relevance, progress
        self.scores: list[float] = []  # dev score after epoch 0, 1, ...
        self.seconds = 0.0  # spent scoring dev (inside the training time)
        self.best_epoch: int | None = None
        self.last_doc_emb: torch.Tensor | None = None  # corpus re-encoded for the last epoch scored (both towers)
        self._best_state: dict[str, torch.Tensor] | None = None

    def __call__(self, epoch: int, model: DualEncoder) -> float:
        if epoch != len(self.scores):
            raise RuntimeError(f"dev selection saw epoch {epoch} after {len(self.scores)} epochs")
        t0 = time.perf_counter()
        doc_emb = self.doc_emb
        if doc_emb is None:  # both towers train: the corpus as this epoch's passage tower encodes it
            doc_emb = self.last_doc_emb = encode_corpus(model, self.dev, self.batch_size, self.progress)
        res = evaluate_retriever(model, self.dev, k=self.k, measures=[self.measure], doc_emb=doc_emb,
                                 batch_size=self.batch_size, progress=False, min_relevance=self.min_relevance)
        score = float(res["metrics"][self.measure])
        self.seconds += time.perf_counter() - t0
        self.scores.append(score)
        if self.best_epoch is None or score > self.scores[self.best_epoch]:
            self.best_epoch = epoch
            self._best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if self.progress:
            print(f"dev {self.measure} after epoch {epoch}: {score:.4f} (best: epoch {self.best_epoch})",
                  file=sys.stderr)
        return score

    def restore(self, model: DualEncoder) -> None:
        """Load the best epoch's weights into ``model`` (in place)."""
        if self._best_state is None:
            raise RuntimeError("dev selection: no epoch was scored")
        model.load_state_dict(self._best_state)

    def summary(self) -> dict:
        return {"measure": self.measure, "split_queries": len(self.dev.judged_queries()),
                "dev_scores": self.scores, "best_epoch": self.best_epoch, "seconds": self.seconds}
