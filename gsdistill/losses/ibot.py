"""iBOT masked-patch self-distillation loss (paper 003 §4.4; DINOv2 weighting)."""
from __future__ import annotations

import torch
from torch import Tensor

from gsdistill.losses.centering import TeacherCentering
from gsdistill.losses.precision import fp32, no_autocast
from gsdistill.losses.validation import check_scores, checks_enabled


class IBOTPatchLoss(TeacherCentering):
    """Per-masked-patch cross-entropy, each image weighted equally.

    ``L = sum_m w_m CE_m / B``, ``CE_m = -sum_k q_m,k log softmax(s_m / T_s)_k``,
    ``w_m = 1 / (masked patches in m's image)``, ``B = masks.shape[0]`` = every image of the batch,
    masked or not (DINOv2's ``iBOTPatchLoss.forward_masked``: ``-loss.sum() / masks.shape[0]``; its
    weighting of paper 003 §4.4's mean over masked patches, so large masks do not dominate).
    Dividing by all images, not by the masked ones, makes the loss a sum over images with a fixed
    normaliser: N ranks with B images each (losses and gradients averaged over ranks, as DDP does)
    give exactly one process with N*B images whichever rank the masks fall on. Shapes:
    ``student_patch_logits: [M, K]``, ``teacher_patch_probs: [M, K]`` (from ``teacher_probs``),
    ``masks: bool[B, P]``; row m is the m-th True of ``masks`` in row-major order
    (``masks.nonzero()`` order), so ``M == masks.sum()``. No masked patch -> 0, still on the graph
    (the student head gets zero gradients, so DDP's gradient all-reduce sees every parameter).
    Rows padded to a fixed count (``gsdistill.views.fixed_shapes``): ``patch_index: long[M']`` gives each
    row's flat index into ``masks`` and ``row_valid: bool[M']`` flags the real ones (``M == row_valid.sum()``
    then, in any order); padding rows get no weight, so the loss is the unpadded batch's.
    Computed and returned in float32 (float64 kept) with autocast off, whatever the inputs' dtype.
    """

    def __init__(self, out_dim: int, student_temp: float = 0.1, center_momentum: float = 0.9) -> None:
        super().__init__(out_dim, center_momentum)
        if student_temp <= 0:
            raise ValueError(f"IBOTPatchLoss: student_temp must be > 0, got {student_temp}")
        self.student_temp = student_temp

    def forward(self, student_patch_logits: Tensor, teacher_patch_probs: Tensor,
                masks: Tensor, patch_index: Tensor | None = None, row_valid: Tensor | None = None) -> Tensor:
        check_scores("IBOTPatchLoss student", student_patch_logits)
        check_scores("IBOTPatchLoss teacher", teacher_patch_probs)
        if not isinstance(masks, Tensor) or masks.dtype != torch.bool or masks.dim() != 2:
            raise ValueError("IBOTPatchLoss: masks must be a bool tensor [B, P]")
        n_rows = student_patch_logits.shape[0]
        if row_valid is not None and (patch_index is None or row_valid.shape != (n_rows,)
                                      or patch_index.shape != (n_rows,)):
            raise ValueError(f"IBOTPatchLoss: padded rows need patch_index and row_valid of shape ({n_rows},)")
        # the row count is known on the host; with checks off it is trusted (reading masks.sum()
        # back would be a host sync on a GPU)
        n_masked = int(masks.sum()) if checks_enabled() else n_rows
        n_given = n_rows if row_valid is None or not checks_enabled() else int(row_valid.sum())
        if student_patch_logits.shape != teacher_patch_probs.shape:
            raise ValueError(f"IBOTPatchLoss: student shape {tuple(student_patch_logits.shape)} "
                             f"does not match teacher shape {tuple(teacher_patch_probs.shape)}")
        if n_given != n_masked or student_patch_logits.shape[1] != self.out_dim:
            raise ValueError(f"IBOTPatchLoss: patch logits shape {tuple(student_patch_logits.shape)} "
                             f"({n_given} valid rows) does not match (masks.sum()={n_masked}, out_dim={self.out_dim})")
        logits = fp32(student_patch_logits)  # fp32 at least: bf16/fp16 logits lose the tail
        if n_rows == 0:
            return logits.sum() * 0.0
        masks = masks.to(logits.device)
        with no_autocast(logits):
            # CE = lse(s / T) sum_k q_k - <q, s> / T: no [M, K] log-softmax is kept. <q, s> as a
            # product and a row sum (one fused reduction when compiled): as an einsum it became a
            # batched cuBLAS GEMV, the top kernel of the step on an H100 (12 % of the compiled step)
            targets = teacher_patch_probs.detach().to(logits.dtype)
            ce = (torch.logsumexp(logits / self.student_temp, dim=-1) * targets.sum(dim=-1)
                  - (targets * logits).sum(dim=-1) / self.student_temp)
            per_image = masks.sum(dim=1)
            if patch_index is not None:
                image_of_patch = patch_index.to(masks.device) // masks.shape[1]
            else:
                image_of_patch = torch.repeat_interleave(  # masks.nonzero()[:, 0] with no host sync
                    torch.arange(masks.shape[0], device=masks.device), per_image, output_size=n_rows)
            # a padding row may point at an unmasked view (no masked patch): clamped, then weighted 0
            weights = 1.0 / per_image[image_of_patch].clamp(min=1).to(ce.dtype)
            if row_valid is not None:
                weights = torch.where(row_valid.to(weights.device), weights, 0.0)
            return (weights * ce).sum() / masks.shape[0]
