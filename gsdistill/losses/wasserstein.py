"""Gaussian 2-Wasserstein loss over the whole batch (paper 002 §3.2 and §A; SyCL).

Each anchor row with a graded candidate is one sample (n of them) of two distributions over the
N candidates: predictions ``X = softmax(s)`` and targets ``Y = softmax(g / T)``, both ``[n, N]``.
With Gaussians fitted to the rows (means ``x̄, ȳ [N]``, unbiased covariances
``C = Xc^T Xc / (n - 1)``, ``Xc = (I - J) X``, ``J = 11^T / n``):

    W = ||x̄ - ȳ||^2 + (||Xc||^2 + ||Yc||^2 - 2 ||Xc Yc^T||_*) / (n - 1),

since ``tr (C_x^{1/2} C_y C_x^{1/2})^{1/2} = ||Xc Yc^T||_* / (n - 1)``: only ``[n, n]`` matrices
are decomposed, never ``[N, N]``. ``gaussian_w2_from_samples`` is the dense reference
(``dense=True``; also taken when rows have different valid masks): dense float64 X and Y,
autograd through ``svdvals``. The fast path (``_SparseW2``, one valid mask ``v`` shared by all
rows, or none) computes the same numbers without any dense target and without an SVD:

* Targets = a constant per row + a sparse part. A valid grade-0 candidate of row b gets
  ``c_b = exp(-lse_b)``, ``lse_b = log((|v| - P_b) + sum_p exp(g_bp / T))`` over its P_b graded
  candidates, so ``Y = c v^T + S`` with S non-zero only at the K graded entries
  (``y_bp - c_b``). ``ȳ = mean(c) v + S^T 1 / n`` and ``||Y||^2 = sum_b ((|v| - P_b) c_b^2 +
  sum_p y_bp^2)`` take O(K + N).
* Each prediction row sums to 1 over v, so ``Xc v = 0`` and, exactly,
  ``Xc Yc^T = Xc (c v^T + S)^T (I - J) = (I - J) X S^T (I - J) =: M``, where ``X S^T`` reads X
  at the graded columns only (O(n K), not O(n^2 N)).
* ``||M||_*`` and the polar factor ``Q = U V^T`` (its gradient): float64 ``eigh`` of the Gram
  ``G = M^T M`` (half the time of an SVD of M on the CPU) with the centring's exact null vector
  ``e = 1/sqrt(n)`` shifted to the bottom (``G - mean(lambda) e e^T``), then
  ``sigma_i = ||M v_i||`` (second order in the error of v_i, unlike ``sqrt(lambda_i)``), and the
  lowest 32 eigendirections -- e, M's null space, the smallest sigma, where eigh of the squared
  matrix loses accuracy -- redone by a thin float64 SVD of ``M V_low`` (Rayleigh-Ritz). Directions
  with ``sigma <= 8 n eps sigma_max`` (and any further eigenvalues under the Gram's noise floor
  ``8 n eps lambda_max``) count as 0 and get no gradient (a valid subgradient). Measured against
  ``svdvals``: the value to ~1e-16 relative down to ``sigma_min / sigma_max = 1e-12`` while at
  most 31 directions lie under ``sqrt(8 n eps) sigma_max`` (~7e-7 at n = 256); the polar factor
  to 1e-12 - 1e-10 at the benchmark's inputs (``sigma_min / sigma_max`` >= 5e-6), degrading as
  ``eps sigma_max^2 / (sigma_i sigma_j)`` for pairs outside that block (3e-7 for a geometric
  spectrum down to 1e-6 at n = 256; an SVD: 4e-12).
* Hand-written backward (labels are constants: no gradient reaches Y). With ``k = 2 / (n - 1)``:
  ``dW/dX = 2/n (x̄ - ȳ) + k (X - x̄) - k (I - J) Q (I - J) S`` (the last term only at graded
  columns), then the softmax backward ``X * (dW/dX - rowsum(dW/dX * X))``, one row block of a few
  passes at a time.

Precision: SyCL computes in float64, and so does every step here whatever the scores' dtype (X is
kept in float64 for the backward: near the optimum ``k X`` and ``k Q S`` cancel); value and
gradient are returned in the scores' dtype. Against the dense path
(``tests/test_losses_wasserstein.py``): values agree to ~1e-15 relative, gradients to ~1e-13 of
their largest entry. Cost at B = 256, N = 4,096 on one CPU thread: ~9-10x ``F.cross_entropy``,
half of it the 256 x 256 float64 ``eigh`` (~5 ms) and three 256^3 float64 matmuls (~2.4 ms)
(``docs/benchmarks.md``).
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from gsdistill.losses.graded_common import GradedLoss, prepare_graded
from gsdistill.losses.validation import big_negative


def gaussian_w2_from_samples(x: Tensor, y: Tensor) -> Tensor:
    """Squared 2-Wasserstein distance between Gaussians fitted to the rows of ``x``, ``y: [n, D]``.

    ``W = ||mu_x - mu_y||^2 + tr(C_x + C_y - 2 (C_x^{1/2} C_y C_x^{1/2})^{1/2})`` with the
    unbiased covariances ``C = Xc^T Xc / (n - 1)`` (Xc: centred rows). Paper 002 prints a minus
    before the trace: a misprint (``../shared/seeds/README.md``; Mathiasen and Hvilshøj 2020,
    which paper 002 cites, has the plus); this is the correct, >= 0 form.
    Since ``tr (C_x^{1/2} C_y C_x^{1/2})^{1/2} = ||Xc Yc^T||_* / (n - 1)`` (the eigenvalues of
    C_x C_y are the squared singular values of Xc Yc^T / (n - 1)), only an ``[n, n]`` matrix
    is decomposed, never ``[D, D]``, and ``svdvals`` has stable gradients. n == 1: mean term only.
    """
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(f"gaussian_w2_from_samples: shapes {tuple(x.shape)} and {tuple(y.shape)} "
                         "must be equal and 2-D")
    n = x.shape[0]
    x_mean, y_mean = x.mean(dim=0), y.mean(dim=0)
    mean_term = (x_mean - y_mean).square().sum()
    if n < 2:
        return mean_term
    cross = (x - x_mean) @ (y - y_mean).t()
    # ||Xc||^2 = ||X||^2 - n ||mean||^2: no centred [n, D] copy (exact up to rounding in float64)
    spread = (x.square().sum() - n * x_mean.square().sum()) + (y.square().sum() - n * y_mean.square().sum())
    return mean_term + (spread - 2.0 * torch.linalg.svdvals(cross).sum()) / (n - 1)


def sparse_centred_cross(x: Tensor, idx: Tensor, s_vals: Tensor) -> Tensor:
    """``(I - J) X S^T (I - J)`` for ``S[b, idx[b, p]] = s_vals[b, p]`` (0 elsewhere; a padding
    slot carries ``s_vals = 0``): ``x: [n, N]``, ``idx, s_vals: [n, P]`` -> ``[n, n]``."""
    n, slots = idx.shape
    rows = torch.arange(n, device=idx.device).repeat_interleave(slots)
    cols = idx.reshape(-1)
    return _centred_cross_from_columns(x[:, cols], rows, s_vals.reshape(-1))


def _centred_cross_from_columns(x_cols: Tensor, rows: Tensor, s_vals: Tensor) -> Tensor:
    """``M = (I - J) X S^T (I - J)`` from X read at the K graded entries only: ``x_cols [n, K]``
    (``x[a, cols[k]]``), ``rows [K]`` (the anchor of entry k), ``s_vals [K]``."""
    n = x_cols.shape[0]
    xs = torch.zeros(n, n, dtype=x_cols.dtype, device=x_cols.device).scatter_add_(
        1, rows.expand(n, -1), x_cols * s_vals)  # (X S^T)[a, b] = sum_k [rows_k = b] x[a, cols_k] s_k
    return _double_centre(xs)


def _double_centre(m: Tensor) -> Tensor:
    m = m - m.mean(dim=0, keepdim=True)
    return m - m.mean(dim=1, keepdim=True)


_SMALL = 32  # the lowest eigenpairs of the Gram, redone by a thin SVD (Rayleigh-Ritz)


def _nuclear_norm(m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(||M||_*, L, V)`` of a doubly centred float64 ``M [n, n]`` with ``L V^T`` its polar
    factor (``U V^T`` on the directions with ``sigma > 0``), from ``eigh(M^T M)`` and a thin SVD of
    its lowest ``_SMALL`` eigendirections (module docstring)."""
    n = m.shape[0]
    eps = torch.finfo(m.dtype).eps
    if n <= _SMALL:
        v = torch.eye(n, dtype=m.dtype, device=m.device)
        w = m
        top = torch.zeros(n, dtype=torch.bool, device=m.device)
        sigma_max = torch.zeros((), dtype=m.dtype, device=m.device)
    else:
        gram = m.t() @ m
        gram -= gram.diagonal().sum() / (n * n)  # - mean eigenvalue * e e^T: e = 1/sqrt(n) lowest
        lam, v = torch.linalg.eigh(gram)
        w = m @ v  # columns M v_i: norms = sigma_i to second order in the error of v_i
        top = lam > lam[-1] * (8 * n * eps)  # above the Gram's noise floor ...
        top[:_SMALL] = False  # ... and not among the lowest (those get the thin SVD)
        sigma_max = lam[-1].clamp(min=0).sqrt()
    norms = torch.linalg.vector_norm(w, dim=0)
    inv = torch.where(top, 1.0 / torch.where(top, norms, 1.0), 0.0)
    low = min(n, _SMALL)
    u_low, s_low, r_t = torch.linalg.svd(w[:, :low], full_matrices=False)  # M V_low = U S R^T
    real = s_low > torch.maximum(sigma_max, s_low[0]) * (8 * n * eps)  # not M's null space
    nuclear = torch.where(top, norms, 0.0).sum() + torch.where(real, s_low, 0.0).sum()
    left = w * inv  # U on the top directions ...
    left[:, :low] = (u_low * real) @ r_t  # ... and U R^T for V_low R, the refined lowest ones
    return nuclear, left, v


_BLOCK = 1 << 17  # float64 elements of a row block (1 MiB: stays in a CPU core's L2 cache)


def _row_blocks(n: int, n_cand: int) -> list[slice]:
    step = max(1, _BLOCK // max(n_cand, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


class _SparseW2(torch.autograd.Function):
    """The fast exact path of the module docstring on the used rows; scalar float64 math inside.

    X is built and read one row block at a time (the reductions of a block run while it is in
    cache; no whole-matrix upcast copy: each fresh ``[n, N]`` float64 buffer costs ~2k page
    faults on the CPU) and kept for the backward in one float64 buffer."""

    @staticmethod
    def forward(ctx, scores, vrow, rows, cols, grades, n_valid):  # noqa: D102
        n, n_cand = scores.shape
        f64, dev = torch.float64, scores.device
        bias = None
        if vrow is not None:  # one shared mask: a broadcast add (masked_fill is ~5x slower)
            bias = torch.zeros(n_cand, dtype=f64, device=dev).masked_fill_(~vrow, big_negative(f64))
        x = torch.empty(n, n_cand, dtype=f64, device=dev)
        x_sum = torch.zeros(n_cand, dtype=f64, device=dev)
        x_sq = torch.empty(n, dtype=f64, device=dev)  # per row, for the backward's row sums
        x_cols = torch.empty(n, cols.numel(), dtype=f64, device=dev)  # x[a, cols[k]]
        blocks = _row_blocks(n, n_cand)
        ones = torch.ones(blocks[0].stop, dtype=f64, device=dev)
        for blk in blocks:
            logits = scores[blk].detach().to(f64, copy=bias is not None)
            if bias is not None:
                logits += bias
            xb = torch.ops.aten._softmax.out(logits, 1, False, out=x[blk])
            x_sum.addmv_(xb.t(), ones[:xb.shape[0]])
            x_sq[blk] = torch.linalg.vector_norm(xb, dim=1).square_()
            torch.gather(xb, 1, cols.expand(xb.shape[0], -1), out=x_cols[blk])
        x_mean = x_sum.div_(n)
        # targets from the graded entries alone (module docstring)
        peak = torch.zeros(n, dtype=f64, device=dev).scatter_reduce_(0, rows, grades, "amax")
        rest = n_valid - torch.bincount(rows, minlength=n).to(f64)  # valid grade-0 candidates per row
        total = (rest * torch.exp(-peak)).index_add_(0, rows, torch.exp(grades - peak[rows]))
        lse = peak + torch.log(total)
        y_vals, c = torch.exp(grades - lse[rows]), torch.exp(-lse)
        s_vals = y_vals - c[rows]
        y_sq = (rest * c.square()).sum() + y_vals.square().sum()
        y_mean = c.mean().expand(n_cand).clone()  # the grade-0 part, then the sparse one
        if vrow is not None:
            y_mean = y_mean.masked_fill_(~vrow, 0.0)
        y_mean.index_add_(0, cols, s_vals / n)
        value = (x_mean - y_mean).square().sum()
        left = v = None
        if n >= 2:
            nuclear, left, v = _nuclear_norm(_centred_cross_from_columns(x_cols, rows, s_vals))  # M = Xc Yc^T
            spread = (x_sq.sum() - n * x_mean.square().sum()) + (y_sq - n * y_mean.square().sum())
            value = value + (spread - 2.0 * nuclear) / (n - 1)
        ctx.save_for_backward(x, x_mean, y_mean, x_sq, x_cols, s_vals, rows, cols, left, v)
        ctx.in_dtype = scores.dtype
        return value.to(scores.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # noqa: D102
        x, x_mean, y_mean, x_sq, x_cols, s_vals, rows, cols, left, v = ctx.saved_tensors
        n, n_cand = x.shape
        grad = grad.to(torch.float64)
        k = grad * (2.0 / (n - 1)) if n >= 2 else torch.zeros_like(grad)
        # dW/dx[b, j] = a[j] + k x[b, j] + d[b, j], d = -k ((I-J) Q (I-J) S) at the graded columns
        a = grad * (2.0 / n) * (x_mean - y_mean) - k * x_mean
        row_dot = k * x_sq  # rowsum(dW/dx * x) = x a + k |x|^2 + rowsum(d * x)
        d_cols = None
        if n >= 2:
            q = _double_centre(left @ v.t())  # polar factor of M (its null directions: 0)
            d_cols = torch.gather(q, 1, rows.expand(n, -1)).mul_(s_vals * -k)  # d[a, cols[k]]
            row_dot += (d_cols * x_cols).sum(dim=1)
        grad_in = torch.empty(n, n_cand, dtype=ctx.in_dtype, device=x.device)
        same = ctx.in_dtype == torch.float64
        for blk in _row_blocks(n, n_cand):  # softmax backward x * (dW/dx - row_dot), in float64
            xb = x[blk]
            out = torch.addcmul(a, xb, k, out=grad_in[blk] if same else None)
            if d_cols is not None:
                out.scatter_add_(1, cols.expand(xb.shape[0], -1), d_cols[blk])
            out.sub_(torch.mv(xb, a).add_(row_dot[blk])[:, None]).mul_(xb)
            if not same:
                grad_in[blk] = out
        return grad_in, None, None, None, None, None


def wasserstein_loss(scores: Tensor, labels: Tensor, valid: Tensor | None = None,
                     label_temperature: float = 1.0, stats: dict | None = None,
                     dense: bool = False) -> Tensor:
    """SyCL loss: ``W2(softmax(s), softmax(y / T_y))`` with each anchor row as one sample.

    Shapes: ``scores, labels: [B, N]`` (N candidates incl. in-batch documents with grade 0),
    ``valid: bool[B, N] | None`` (padding gets probability 0 on both sides). Anchors without a
    positive grade are left out of the batch and counted. Computed in float64 (SyCL), returned in
    the scores' dtype. Temperature on the scores is the caller's (scores are logits). When all
    rows share one valid mask (or there is none) the exact fast path of the module docstring runs;
    otherwise, or with ``dense=True``, the dense reference (``gaussian_w2_from_samples``).
    """
    valid, labels, pset, n_valid, used = prepare_graded("WassersteinLoss", scores, labels, valid, stats)
    all_used = bool(used.all())
    if not dense and (valid is None or bool((valid == valid[:1]).all())):
        rows, cols = pset.rows, pset.cols
        if not all_used:
            scores = scores[used]
            rows = (used.cumsum(0) - 1)[rows]
        if scores.shape[0] == 0:
            return scores.sum() * 0.0
        grades = labels[pset.rows, pset.cols].to(torch.float64) / label_temperature
        return _SparseW2.apply(scores, None if valid is None else valid[0], rows, cols, grades,
                               float(scores.shape[1]) if valid is None else n_valid[0].to(torch.float64))
    logits = scores.to(torch.float64)
    grades = labels.to(torch.float64) / label_temperature
    if valid is not None:
        logits = logits.masked_fill(~valid, big_negative(torch.float64))
        grades = grades.masked_fill(~valid, big_negative(torch.float64))
    if not all_used:
        logits, grades = logits[used], grades[used]
    if logits.shape[0] == 0:
        return scores.sum() * 0.0
    x = torch.softmax(logits, dim=1)
    y = torch.exp(grades - torch.logsumexp(grades, dim=1, keepdim=True))  # = softmax(grades)
    return gaussian_w2_from_samples(x, y).to(scores.dtype)


class WassersteinLoss(GradedLoss):
    """Batch Gaussian 2-Wasserstein loss (see ``wasserstein_loss``); forward(scores, labels, valid)."""

    def __init__(self, label_temperature: float = 1.0) -> None:
        super().__init__()
        self.label_temperature = label_temperature

    def forward(self, scores: Tensor, labels: Tensor, valid: Tensor | None = None) -> Tensor:
        self.last_stats = {}
        return wasserstein_loss(scores, labels, valid, self.label_temperature, self.last_stats)
