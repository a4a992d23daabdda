"""Noise-robust classification losses over candidates, the baselines of paper 004 (Table 1).

Each treats an anchor's candidates as classes and its positive set as the label: with
``log p_P = LSE_P(s) - LSE_valid(s)`` (probability mass on the positives), one positive gives the
published single-label form exactly. forward(scores [B, N], positives bool[B, N], valid=None);
anchors without a positive are excluded and counted (``last_stats``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from gsdistill.losses.masks import prepare_masks
from gsdistill.losses.multi_positive import MultiPositiveLoss
from gsdistill.losses.multi_positive import candidate_log_probs
from gsdistill.losses.validation import big_negative, mean_over


def _log_p_pos(name: str, scores, positives, valid, stats):
    """``(prepared masks, log_probs [B, N], log p_P [B])`` (0 for anchors without a positive)."""
    prep = prepare_masks(name, scores, positives, valid, stats)
    log_probs = candidate_log_probs(scores, prep.valid)
    slots = log_probs.gather(1, prep.pset.idx).masked_fill(~prep.pset.ok, big_negative(scores.dtype))
    log_p_pos = torch.logsumexp(slots, dim=1)
    return prep, log_probs, torch.where(prep.used, log_p_pos, torch.zeros_like(log_p_pos))


class GCELoss(MultiPositiveLoss):
    """Generalized cross-entropy (Zhang & Sabuncu 2018): ``(1 - p_P^q) / q``, q in (0, 1]."""

    def __init__(self, q: float = 0.7) -> None:
        super().__init__()
        if not 0.0 < q <= 1.0:
            raise ValueError(f"GCELoss: q must be in (0, 1], got {q}")
        self.q = q

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, _, log_p = _log_p_pos("GCELoss", scores, positives, valid, self.last_stats)
        return mean_over((1.0 - torch.exp(self.q * log_p)) / self.q, prep.used, scores)


class NCELoss(MultiPositiveLoss):
    """Normalized cross-entropy (Ma et al. 2020): ``-log p_P / sum_{d valid} -log p_d``."""

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, log_probs, log_p = _log_p_pos("NCELoss", scores, positives, valid, self.last_stats)
        if prep.valid is not None:
            log_probs = torch.where(prep.valid, log_probs, torch.zeros_like(log_probs))
        denom = -log_probs.sum(dim=1)
        return mean_over(-log_p / denom.clamp(min=torch.finfo(scores.dtype).tiny), prep.used, scores)


class AGCELoss(MultiPositiveLoss):
    """Asymmetric GCE (Zhou et al. 2021): ``((a + 1)^q - (a + p_P)^q) / q``; defaults a=1, q=2."""

    def __init__(self, a: float = 1.0, q: float = 2.0) -> None:
        super().__init__()
        if a <= 0 or q <= 0:
            raise ValueError(f"AGCELoss: need a > 0 and q > 0, got a={a}, q={q}")
        self.a, self.q = a, q

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, _, log_p = _log_p_pos("AGCELoss", scores, positives, valid, self.last_stats)
        per_anchor = ((self.a + 1) ** self.q - (self.a + log_p.exp()) ** self.q) / self.q
        return mean_over(per_anchor, prep.used, scores)


class AULLoss(MultiPositiveLoss):
    """Asymmetric unhinged loss (Zhou et al. 2021): ``((a - p_P)^q - (a - 1)^q) / q``; a=1.5, q=0.9."""

    def __init__(self, a: float = 1.5, q: float = 0.9) -> None:
        super().__init__()
        if a <= 1 or q <= 0:
            raise ValueError(f"AULLoss: need a > 1 and q > 0, got a={a}, q={q}")
        self.a, self.q = a, q

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, _, log_p = _log_p_pos("AULLoss", scores, positives, valid, self.last_stats)
        per_anchor = ((self.a - log_p.exp()) ** self.q - (self.a - 1) ** self.q) / self.q
        return mean_over(per_anchor, prep.used, scores)


class LabelSmoothingLoss(MultiPositiveLoss):
    """Label smoothing (Szegedy et al. 2016): cross-entropy against ``(1 - eps) u_P + eps u_valid``
    (u = uniform over the positives / over the valid candidates); eps=0.1."""

    def __init__(self, epsilon: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= epsilon < 1.0:
            raise ValueError(f"LabelSmoothingLoss: epsilon must be in [0, 1), got {epsilon}")
        self.epsilon = epsilon

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, log_probs, _ = _log_p_pos("LabelSmoothingLoss", scores, positives, valid,
                                        self.last_stats)
        # CE against the mixture = (1 - eps) * mean over positives + eps * mean over valid
        pos_part = log_probs.gather(1, prep.pset.idx).masked_fill(~prep.pset.ok, 0.0).sum(dim=1)
        if prep.valid is not None:
            log_probs = torch.where(prep.valid, log_probs, torch.zeros_like(log_probs))
        per_anchor = -((1 - self.epsilon) * pos_part / prep.pset.count.clamp(min=1)
                       + self.epsilon * log_probs.sum(dim=1) / prep.n_valid.clamp(min=1))
        return mean_over(per_anchor, prep.used, scores)


class LabelRelaxationLoss(MultiPositiveLoss):
    """Label relaxation (Lienen & Huellermeier 2021), the credal-set baseline of paper 004.

    Zero when ``p_P >= 1 - alpha``; otherwise ``KL(r || p)`` with the projection ``r`` of ``p`` onto
    the credal set: ``r_d = (1 - alpha) p_d / p_P`` on positives, ``alpha p_d / (1 - p_P)`` on the
    others (r computed without gradient, as in the reference). One positive: ``r = 1 - alpha`` on
    it. alpha=0.1.
    """

    def __init__(self, alpha: float = 0.1) -> None:
        super().__init__()
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"LabelRelaxationLoss: alpha must be in (0, 1), got {alpha}")
        self.alpha = alpha

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, log_probs, log_p = _log_p_pos("LabelRelaxationLoss", scores, positives, valid,
                                            self.last_stats)
        with torch.no_grad():  # the projection r of p onto the credal set (no gradient)
            tiny = torch.finfo(scores.dtype).tiny
            p_pos = log_p.exp()[:, None]
            target = log_probs.exp() * (self.alpha / (1 - p_pos).clamp(min=tiny))
            pos_target = (log_probs.gather(1, prep.pset.idx).exp() * (1 - self.alpha)
                          / p_pos.clamp(min=tiny))
            target[prep.pset.rows, prep.pset.cols] = pos_target[prep.pset.ok]
            inside = p_pos[:, 0] >= 1 - self.alpha
        kl = (torch.xlogy(target, target) - target * log_probs).sum(dim=1)
        return mean_over(torch.where(inside, torch.zeros_like(kl), kl), prep.used, scores)


class _ActivePassive(MultiPositiveLoss):
    """``alpha * NCE + beta * passive`` (active-passive loss, Ma et al. 2020, "Normalized Loss
    Functions for Deep Learning with Noisy Labels", ICML; the NCE+AGCE / NCE+AUL pairs of Zhou et
    al. 2021, "Asymmetric Loss Functions for Learning with Noisy Labels", ICML). Shapes as NCE."""

    passive_cls: type[MultiPositiveLoss]

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, **passive_kwargs) -> None:
        super().__init__()
        if alpha < 0 or beta < 0 or alpha + beta == 0:
            raise ValueError(f"{type(self).__name__}: need alpha, beta >= 0, not both 0, got {alpha}, {beta}")
        self.alpha, self.beta = alpha, beta
        self.nce, self.passive = NCELoss(), self.passive_cls(**passive_kwargs)

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None) -> Tensor:
        value = self.alpha * self.nce(scores, positives, valid) + self.beta * self.passive(scores, positives, valid)
        self.last_stats = dict(self.nce.last_stats)
        return value


class NCEAGCELoss(_ActivePassive):
    """NCE+AGCE: ``alpha * (-log p_P / sum_d -log p_d) + beta * ((a + 1)^q - (a + p_P)^q) / q``
    (paper 004's "NAGCE"); defaults alpha = beta = 1, a = 1, q = 2. ``scores [B, N]``,
    ``positives bool[B, N]``, ``valid bool[B, N] | None`` -> mean over anchors with a positive."""

    passive_cls = AGCELoss


class NCEAULLoss(_ActivePassive):
    """NCE+AUL: ``alpha * (-log p_P / sum_d -log p_d) + beta * ((a - p_P)^q - (a - 1)^q) / q``
    (paper 004's "NAUL"); defaults alpha = beta = 1, a = 1.5, q = 0.9. Shapes as NCE+AGCE."""

    passive_cls = AULLoss


def reciprocal_jaccard(doc_sim: Tensor, k: int, cols: Tensor | None = None) -> Tensor:
    """Jaccard overlap of reciprocal k-nearest-neighbour sets, ``float[N, C]``.

    ``kNN(i)`` = the k columns of largest ``doc_sim[i]`` (i itself included, as in Zerveas et al.);
    ``R(i) = {j in kNN(i) : i in kNN(j)}``; ``J[i, c] = |R(i) & R(c)| / |R(i) | R(c)|`` for the
    candidates ``cols: long[C]`` (default all N). ``doc_sim: float[N, N]`` symmetric similarities.
    Each R(i) has at most k members, so the overlaps are a sparse product: O(N k C), not O(N^2 C).
    """
    n = doc_sim.shape[0]
    knn = torch.zeros(n, n, dtype=torch.bool, device=doc_sim.device)
    knn.scatter_(1, doc_sim.topk(min(k, n), dim=1).indices, True)
    recip = (knn & knn.T).to(doc_sim.dtype)
    cols = torch.arange(n, device=doc_sim.device) if cols is None else cols
    inter = torch.sparse.mm(recip.to_sparse(), recip[cols].T.contiguous())
    size = recip.sum(dim=1)
    union = size[:, None] + size[cols][None, :] - inter
    return inter / union.clamp(min=1)


class EvidenceLabelSmoothingLoss(MultiPositiveLoss):
    """Evidence-based label smoothing (ELS; Zerveas, Rekabsaz & Eickhoff 2023, "Enhancing the
    Ranking Context of Dense Retrieval through Reciprocal Nearest Neighbors", EMNLP).

    Label smoothing whose mass goes to the candidates that look like the ground truth, not to all
    candidates alike. With candidate-candidate similarities ``S = doc_sim`` and the reciprocal-NN
    Jaccard ``J = reciprocal_jaccard(S, k)``:

        E[d, p]  = (1 - lam) * S[d, p] + lam * J[d, p]
        e[b, d]  = max(0, max_{p in P_b} E[d, p])            for valid non-positive d (else 0)
        t[b, d]  = (1 - eps) / |P_b| on positives,  eps * e[b, d] / sum_d' e[b, d'] elsewhere
        loss     = mean_b  -sum_d t[b, d] log p_b(d),   p_b = softmax over the valid candidates

    An anchor whose non-positives carry no evidence (all e = 0) keeps eps on its positives (plain
    CE). Shapes: ``scores float[B, N]``, ``positives bool[B, N]``, ``valid bool[B, N] | None``,
    ``doc_sim float[N, N]`` (e.g. cosine of the candidate passage embeddings, no gradient);
    defaults eps = 0.1, lam = 0.5, k = 5.
    """

    needs_doc_similarity = True  # the retriever objective passes doc_sim of the candidates

    def __init__(self, epsilon: float = 0.1, lam: float = 0.5, k: int = 5) -> None:
        super().__init__()
        if not 0.0 <= epsilon < 1.0 or not 0.0 <= lam <= 1.0 or k < 1:
            raise ValueError(f"EvidenceLabelSmoothingLoss: need 0 <= epsilon < 1, 0 <= lam <= 1, k >= 1, "
                             f"got {epsilon}, {lam}, {k}")
        self.epsilon, self.lam, self.k = epsilon, lam, k

    def forward(self, scores: Tensor, positives: Tensor, valid: Tensor | None = None,
                doc_sim: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        prep, log_probs, _ = _log_p_pos("EvidenceLabelSmoothingLoss", scores, positives, valid, self.last_stats)
        if scores.shape[0] == 0:
            return scores.sum() * 0.0
        if doc_sim is None or doc_sim.shape != (scores.shape[1], scores.shape[1]):
            raise ValueError(f"EvidenceLabelSmoothingLoss: doc_sim must be float[N, N] with N = "
                             f"{scores.shape[1]} candidates, got {None if doc_sim is None else tuple(doc_sim.shape)}")
        with torch.no_grad():
            sim = doc_sim.detach().to(scores.dtype)
            pos = positives.to(torch.bool) if prep.valid is None else positives.to(torch.bool) & prep.valid
            cols = prep.pset.idx[prep.pset.ok].unique()  # every candidate that is some anchor's positive
            if cols.numel() == 0:  # no anchor has a positive: nothing to smooth towards
                return mean_over(log_probs[:, 0] * 0.0, prep.used, scores)
            evidence_pair = (1 - self.lam) * sim[:, cols] + self.lam * reciprocal_jaccard(sim, self.k, cols)
            slot = torch.searchsorted(cols, prep.pset.idx).clamp(max=cols.numel() - 1)  # padding: masked below
            per_pos = evidence_pair[:, slot].permute(1, 0, 2)  # [B, N, P]: E[d, p] per positive slot
            per_pos = per_pos.masked_fill(~prep.pset.ok[:, None, :], -torch.inf)
            evidence = per_pos.amax(dim=2).clamp(min=0).nan_to_num(0.0, neginf=0.0)  # [B, N]
            keep = ~pos if prep.valid is None else (~pos & prep.valid)
            evidence = evidence * keep
            total = evidence.sum(dim=1, keepdim=True)
            has = total[:, 0] > 0
            eps = torch.where(has, torch.full_like(total[:, 0], self.epsilon), torch.zeros_like(total[:, 0]))
            target = evidence / total.clamp(min=torch.finfo(scores.dtype).tiny) * eps[:, None]
            target = target + pos.to(scores.dtype) * ((1 - eps) / prep.pset.count.clamp(min=1))[:, None]
        safe = torch.where(target > 0, log_probs, torch.zeros_like(log_probs))
        return mean_over(-(target * safe).sum(dim=1), prep.used, scores)
