"""DINO class-token self-distillation loss (paper 003 §4.3; DINOv2 / DINOv3)."""
from __future__ import annotations

import torch
from torch import Tensor

from gsdistill.losses.centering import TeacherCentering
from gsdistill.losses.precision import fp32, no_autocast
from gsdistill.losses.validation import check_scores


class DINOLoss(TeacherCentering):
    """Cross-entropy between teacher targets and student predictions over pairs of views.

    ``L = mean_{(i, j), i != j} mean_b [ -sum_k q_j[b, k] log softmax(s_i[b] / T_s)_k ]``, over
    student views i and teacher views j (paper 003 §4.3 ``L_distill``; DINOv2 default T_s = 0.1).
    Shapes: ``student_logits``: list of S tensors ``[B, K]``; ``teacher_probs``: list of T tensors
    ``[B, K]`` (from ``teacher_probs(...)``). The student list starts with the same views, in
    the same order, as the teacher list (global views first, then local ones when the teacher also
    sees local views, paper 003 Table A1); with ``ignore_diagonal`` the pairs i == j are excluded.
    Targets need no gradient; ``teacher_probs`` comes from ``TeacherCentering``. Computed and
    returned in float32 (float64 kept) with autocast off, whatever the inputs' dtype.
    """

    def __init__(self, out_dim: int, student_temp: float = 0.1, center_momentum: float = 0.9) -> None:
        super().__init__(out_dim, center_momentum)
        if student_temp <= 0:
            raise ValueError(f"DINOLoss: student_temp must be > 0, got {student_temp}")
        self.student_temp = student_temp

    def forward(self, student_logits: list[Tensor], teacher_probs: list[Tensor],
                ignore_diagonal: bool = True) -> Tensor:
        if len(student_logits) == 0 or len(teacher_probs) == 0:
            raise ValueError("DINOLoss: need at least one student and one teacher view")
        shape = tuple(student_logits[0].shape)
        for i, s in enumerate(student_logits):
            check_scores(f"DINOLoss student view {i}", s)
        for j, t in enumerate(teacher_probs):
            check_scores(f"DINOLoss teacher view {j}", t)
        for what, views in (("student", student_logits), ("teacher", teacher_probs)):
            for v in views:
                if tuple(v.shape) != shape or shape[-1] != self.out_dim:
                    raise ValueError(f"DINOLoss: {what} view shape {tuple(v.shape)} does not match "
                                     f"student view 0 shape {shape} / out_dim {self.out_dim}")
        n_pairs = len(student_logits) * len(teacher_probs) - (
            min(len(student_logits), len(teacher_probs)) if ignore_diagonal else 0)  # known on the host
        if n_pairs == 0:
            raise ValueError("DINOLoss: no (student, teacher) pair left once same-view pairs are "
                             "excluded; give more views or ignore_diagonal=False")
        # fp32 at least, autocast off: bf16 logits lose the softmax tail, and under autocast the
        # einsums below would run in bf16 even on fp32 inputs. No [S, B, K] log-softmax is kept:
        # CE(q, s) = -sum_k q_k log softmax(s / T)_k = lse(s / T) sum_k q_k - <q, s> / T
        with no_autocast(student_logits[0]):
            s = fp32(torch.stack(student_logits))  # [S, B, K]
            targets = torch.stack(teacher_probs).detach().to(s.dtype)  # [T, B, K]
            lse = torch.logsumexp(s / self.student_temp, dim=-1)  # [S, B]
            # [S, T] matrix of batch-mean cross-entropies. <q, s> summed over (B, K) as products and
            # sums (fused into one reduction when compiled; a transient [S, T, B, K] in eager): as an
            # einsum it was a GEMM of inner size T (= 2) in backward, cuBLAS's slowest shape
            dots = (s.unsqueeze(1) * targets.unsqueeze(0)).sum(dim=(-2, -1))
            ce = (torch.einsum("sb,tb->st", lse, targets.sum(dim=-1)) - dots / self.student_temp) / shape[0]
            if ignore_diagonal:  # a zero-diagonal sum, not a boolean selection: no host sync
                ce = ce * (1.0 - torch.eye(*ce.shape, dtype=ce.dtype, device=ce.device))
            return ce.sum() / n_pairs
