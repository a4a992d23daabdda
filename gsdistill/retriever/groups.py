"""Training groups (paper 000 §4.4): per query G passages = up to M positives + hard negatives.

A group keeps graded labels (for list-wise losses). Negatives are drawn, in order of preference,
from the query's hard negatives (file-given or mined), its judged non-relevant docs, then random
corpus docs that are not relevant. Groups are re-drawn every epoch from ``seed + epoch``, so the
positives that fill the M slots rotate across epochs (as Tevatron rotates its single positive).

In a batch every query is scored against every passage of every group (in-batch negatives; with
several devices the gathered passages of all ranks). ``candidate_labels`` builds the [B, N] grade
matrix for those candidates from the qrels, so a passage of another query's group that is relevant
to this query counts as a positive, and repeated passages are masked out of ``valid``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from gsdistill.retriever.data import RetrievalData


@dataclass
class TrainGroup:
    qid: str
    doc_idx: list[int]  # G corpus indices, positives first
    grades: list[float]  # grade of each passage for this query (0 = not relevant)


class GroupSampler:
    """Builds one epoch of groups: ``epoch_groups(epoch) -> list[TrainGroup]`` (shuffled).

    Args:
        data: the training data (its qrels are the labels; inject noise into them beforehand).
        group_size: G passages per query. max_positives: M (<= G - 1 so a negative always fits).
        mined_negatives: optional ``{qid: [corpus index]}`` (e.g. the zero-shot model's top hits),
            tried before judged non-relevant docs.
    """

    def __init__(self, data: RetrievalData, group_size: int = 8, max_positives: int = 4, seed: int = 0,
                 mined_negatives: dict[str, list[int]] | None = None):
        if group_size < 2:
            raise ValueError(f"group_size must be >= 2 (a positive and a negative), got {group_size}")
        if not 1 <= max_positives <= group_size - 1:
            raise ValueError(f"max_positives must be in [1, group_size - 1 = {group_size - 1}], got {max_positives}")
        self.data, self.group_size, self.max_positives, self.seed = data, group_size, max_positives, seed
        self.mined = mined_negatives or {}
        self.qids = data.judged_queries()
        if not self.qids:
            raise ValueError(f"{data.source}: no query with a relevant document to train on")

    def _group(self, qid: str, rng: random.Random) -> TrainGroup:
        index, grades = self.data.doc_index, self.data.qrels[qid]
        positives = [index[d] for d, g in grades.items() if g > 0 and d in index]
        relevant = set(positives)
        pos = rng.sample(positives, min(self.max_positives, len(positives)))
        n_neg = self.group_size - len(pos)
        hard = [index[d] for d in self.data.negatives.get(qid, []) if d in index]
        hard += [i for i in self.mined.get(qid, [])]
        judged_neg = [index[d] for d, g in grades.items() if g <= 0 and d in index]
        neg: list[int] = []
        for pool in (hard, judged_neg):
            pool = [i for i in dict.fromkeys(pool) if i not in relevant and i not in neg]
            neg += rng.sample(pool, min(n_neg - len(neg), len(pool)))
        n_docs = len(self.data.doc_ids)
        if len(relevant) + n_neg > n_docs:
            raise ValueError(f"{self.data.source}: corpus of {n_docs} docs too small for groups of {self.group_size}")
        taken = set(neg)
        while len(neg) < n_neg:  # random fill from the corpus, never a relevant doc
            i = rng.randrange(n_docs)
            if i not in relevant and i not in taken:
                neg.append(i)
                taken.add(i)
        docs = pos + neg
        return TrainGroup(qid, docs, [grades.get(self.data.doc_ids[i], 0) for i in docs])

    def epoch_groups(self, epoch: int) -> list[TrainGroup]:
        rng = random.Random(self.seed * 100_003 + epoch)
        groups = [self._group(q, rng) for q in self.qids]
        rng.shuffle(groups)
        return groups


def batches(groups: list[TrainGroup], batch_size: int, drop_last: bool = False) -> list[list[TrainGroup]]:
    out = [groups[i:i + batch_size] for i in range(0, len(groups), batch_size)]
    return out[:-1] if drop_last and out and len(out[-1]) < batch_size else out


def candidate_labels(qids: list[str], cand_idx: torch.Tensor, data: RetrievalData,
                     qrels: dict[str, dict[str, int]] | None = None, visible: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Grades ``float[B, N]`` of each query against each candidate passage and ``valid: bool[B, N]``.

    ``cand_idx: long[N]`` corpus indices of all candidates (in-batch, possibly gathered from every
    device); ``visible: bool[B, N]`` which candidates each query may see (default all). A passage
    that a query sees twice keeps only its first visible column valid.
    """
    qrels = data.qrels if qrels is None else qrels
    idx = cand_idx.tolist()
    grades = torch.zeros(len(qids), len(idx))
    for row, qid in enumerate(qids):
        g = qrels.get(qid, {})
        for col, i in enumerate(idx):
            grade = g.get(data.doc_ids[i], 0)
            if grade:
                grades[row, col] = float(grade)
    if visible is None:
        visible = torch.ones(len(qids), len(idx), dtype=torch.bool)
    n = len(idx)
    same = cand_idx.view(-1, 1) == cand_idx.view(1, -1)
    earlier_same = same & torch.ones(n, n, dtype=torch.bool).triu(1)  # [k, j]: k < j, same doc
    repeated = (visible.float() @ earlier_same.float()) > 0
    return grades.clamp_min(0), visible & ~repeated
