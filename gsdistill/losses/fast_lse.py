"""Row log-sum-exp over "all valid candidates but a few", plus optional linear terms, with a
hand-written backward.

``lse_minus_linear(x, ...)`` never builds a masked copy of ``x``; its backward is one multiply by
the saved softmax plus a few scattered entries, where autograd's graph for the same formula
(``logsumexp`` backward, then a gather's scatter and a row sum's expand, each summed into the
gradient) walks the ``[B, N]`` matrix several more times. ``tools/bench/bench_losses.py`` measures it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gsdistill.losses.validation import big_negative


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _lse_and_probs(x: Tensor, rows: Tensor, cols: Tensor, valid: Tensor | None):
    """``(lse [B], weights [B, N], total [B, 1])`` over each row's valid entries minus the excluded
    (rows, cols); ``weights / total`` is the softmax over that set (left unnormalised: the backward
    pass folds the division into its single multiply).

    One fused softmax over all valid entries; the excluded ones are zeroed and the rest summed
    (no cancellation): ``lse = LSE_all + log(total)`` with ``LSE_all = max_n x - log max_n softmax``
(the largest probability is >= 1/N, so its log is exact; ``amax`` is far cheaper than ``max``
with indices on the CPU).
    """
    work = x.detach().to(_compute_dtype(x.dtype))
    if valid is not None:
        work = work.masked_fill(~valid, -torch.inf)
    peak = work.amax(dim=1, keepdim=True)
    probs = torch.softmax(work, dim=1)
    lse_all = peak - torch.log(probs.amax(dim=1, keepdim=True))  # the top entry's probability
    probs[rows, cols] = 0.0
    total = probs.sum(dim=1, keepdim=True)
    # If the excluded entries held almost all the mass, the kept probabilities underflow (and a
    # row without any valid entry is NaN): redo those rare rows with the exclusions masked first.
    tiny = torch.finfo(work.dtype).tiny
    weak = ~(total[:, 0] >= tiny * 1e18)
    if bool(weak.any()):
        excluded = torch.zeros_like(work, dtype=torch.bool)
        excluded[rows, cols] = True
        redo = work[weak].masked_fill(excluded[weak], -torch.inf)
        redo_peak = redo.amax(dim=1, keepdim=True)
        redo_peak = torch.where(torch.isfinite(redo_peak), redo_peak, torch.zeros_like(redo_peak))
        probs[weak] = torch.exp(redo - redo_peak)
        lse_all[weak] = redo_peak
        total[weak] = probs[weak].sum(dim=1, keepdim=True)
    lse = (lse_all + torch.log(total.clamp(min=tiny)))[:, 0]
    lse = torch.where(total[:, 0] == 0, torch.full_like(lse, big_negative(work.dtype)), lse)
    return lse, probs, total.clamp(min=tiny)


class _LseMinusLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ex_rows, ex_cols, valid, lin_rows, lin_cols, lin_coef, row_coef):  # noqa: D102
        lse, probs, total = _lse_and_probs(x, ex_rows, ex_cols, valid)
        out = lse
        work = x.detach().to(probs.dtype)
        if lin_rows is not None:
            picked = work[lin_rows, lin_cols] * lin_coef.to(probs.dtype)
            out = out - torch.zeros_like(out).index_add_(0, lin_rows, picked)
        if row_coef is not None:
            row_sum = work.sum(dim=1) if valid is None else torch.where(valid, work, 0.0).sum(dim=1)
            out = out - row_coef.to(probs.dtype) * row_sum
        ctx.save_for_backward(probs, total, valid, lin_rows, lin_cols, lin_coef, row_coef)
        ctx.in_dtype = x.dtype
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        probs, total, valid, lin_rows, lin_cols, lin_coef, row_coef = ctx.saved_tensors
        grad = grad.to(probs.dtype)
        scale = grad[:, None] / total
        if row_coef is None:
            grad_x = probs * scale
        elif valid is None:  # g * softmax - g * row_coef in one pass
            grad_x = torch.addcmul(-(grad * row_coef.to(probs.dtype))[:, None], probs, scale)
        else:
            shift = torch.where(valid, (grad * row_coef.to(probs.dtype))[:, None], 0.0)
            grad_x = torch.addcmul(-shift, probs, scale)
        if lin_rows is not None:
            grad_x.index_put_((lin_rows, lin_cols), -grad[lin_rows] * lin_coef.to(probs.dtype),
                              accumulate=True)
        return grad_x.to(ctx.in_dtype), None, None, None, None, None, None, None


def lse_minus_linear(x: Tensor, ex_rows: Tensor, ex_cols: Tensor, valid: Tensor | None = None,
                     lin_rows: Tensor | None = None, lin_cols: Tensor | None = None,
                     lin_coef: Tensor | None = None, row_coef: Tensor | None = None) -> Tensor:
    """Per row b -> ``[B]``:
    ``log sum_{n in S_b} exp(x[b, n]) - sum_{k: lin_rows[k] = b} lin_coef[k] x[b, lin_cols[k]]
    - row_coef[b] sum_{n valid} x[b, n]``, with ``S_b`` = valid entries of row b minus the
    excluded ``(ex_rows, ex_cols)``. An empty ``S_b`` gives ``big_negative`` (about -inf) for the
    log-sum-exp, with zero gradient. Coefficients get no gradient.
    """
    return _LseMinusLinear.apply(x, ex_rows, ex_cols, valid, lin_rows, lin_cols,
                                 None if lin_coef is None else lin_coef.detach(),
                                 None if row_coef is None else row_coef.detach())


def logsumexp_excluding(x: Tensor, rows: Tensor, cols: Tensor, valid: Tensor | None = None) -> Tensor:
    """``log sum_{n valid, (b, n) not excluded} exp(x[b, n])`` -> ``[B]``; gradient = softmax over
    that set (``lse_minus_linear`` without linear terms)."""
    return _LseMinusLinear.apply(x, rows, cols, valid, None, None, None, None)


class _PositiveMassNLL(torch.autograd.Function):
    # in place wherever possible: on the CPU each fresh [B, N] float64 buffer costs page faults
    @staticmethod
    def forward(ctx, x, pos, valid, used):  # noqa: D102
        probs = x.detach().to(torch.float64, copy=True)
        if valid is not None:
            probs.masked_fill_(~valid, -torch.inf)
        probs.sub_(probs.amax(dim=1, keepdim=True)).exp_()  # float64 keeps positives down to e^-700
        probs.div_(probs.sum(dim=1, keepdim=True))
        mass = pos.to(torch.float64).mul_(probs).sum(dim=1)  # same dtypes: mixed bool ops are slow
        mass = torch.where(used, mass, torch.ones_like(mass))  # rows without a positive: 0, no NaN
        ctx.save_for_backward(probs, pos, mass)
        ctx.in_dtype = x.dtype
        half = x.dtype in (torch.float16, torch.bfloat16)  # as candidate_log_probs: float32 out
        return (-torch.log(mass)).to(torch.float32 if half else x.dtype)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        probs, pos, mass = ctx.saved_tensors
        scale = grad.to(probs.dtype)[:, None]
        # d/dx of -log sum_P softmax = softmax - [n in P] softmax / mass
        grad_x = pos.to(probs.dtype).mul_(-scale / mass[:, None]).add_(scale).mul_(probs)
        return grad_x.to(ctx.in_dtype), None, None, None


def positive_mass_nll(x: Tensor, pos: Tensor, valid: Tensor | None, used: Tensor) -> Tensor:
    """``-log sum_{n in P_b} softmax(x_b)_n`` per row -> ``[B]`` (SumMargLH), from one fused float64
    softmax with a hand-written backward: no gathered slots, so no host sync (the dense path that
    ``sum_marg_lh`` takes with value checks off). ``pos``: ``bool[B, N]`` positives (valid ones);
    rows with ``used == False`` give 0 with zero gradient. A positive mass below float64's range
    (log-probability < -700) gives inf, which the training loop reports as divergence."""
    return _PositiveMassNLL.apply(x, pos, valid, used)
