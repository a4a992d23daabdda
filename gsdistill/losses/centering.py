"""Teacher targets for self-distillation: softmax centering (EMA centre) and Sinkhorn-Knopp.

DINOv2 semantics (``dinov2/loss/dino_clstoken_loss.py``: ``softmax_center_teacher``,
``sinkhorn_knopp_teacher``, ``update_center``; paper 003 §4.3), world-aware: under ``torch.distributed`` the batch statistics
(centre mean, Sinkhorn totals and prototype sums, global batch size) are all-reduced, so N ranks
with B rows each produce what one process with N*B rows would.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from gsdistill.losses.gather import all_reduce_sum, is_distributed
from gsdistill.losses.precision import fp32, no_autocast
from gsdistill.losses.validation import check_scores, checks_enabled


def _all_reduce_max(x: Tensor) -> Tensor:
    if not is_distributed():
        return x
    out = x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return out


def _local_max(x: Tensor, dim: int | None = None) -> Tensor:
    """``x.max()`` (or over ``dim``, keepdim) that is ``-inf`` for a rank holding no rows, so an
    empty rank still joins the max all-reduce (a masked-patch batch can be empty on one rank)."""
    if x.numel():
        return x.max() if dim is None else x.max(dim=dim, keepdim=True).values
    shape = () if dim is None else (1, x.shape[1])
    return torch.full(shape, float("-inf"), dtype=x.dtype, device=x.device)


# exp() of an argument below float32's smallest normal (e^-87.3) takes the CPU's slow path, 300-600x
# slower (measured: 6.5 ms vs 10 us for 40k entries), and the result is noise next to the 1 of each
# row's or column's maximum: such arguments are floored there. float64 keeps its own range (e^-708).
_EXP_FLOOR = {torch.float32: -87.0, torch.float64: -708.0}


def _exp(x: Tensor) -> Tensor:
    """``exp(x)`` for ``x <= 0`` log-masses, floored at the smallest normal (see ``_EXP_FLOOR``)."""
    floor = _EXP_FLOOR.get(x.dtype)
    return torch.exp(x if floor is None else x.clamp_min(floor))


def _logsumexp_rows(x: Tensor) -> Tensor:
    """``torch.logsumexp(x, dim=1, keepdim=True)`` with the floored exp (the row max contributes 1,
    so the floor changes the sum by at most K * 1.6e-38)."""
    peak = x.amax(dim=1, keepdim=True)
    return peak + torch.log(_exp(x - peak).sum(dim=1, keepdim=True))


def _global_logsumexp_over_batch(x: Tensor, row_valid: Tensor | None = None) -> Tensor:
    """``log sum_b exp(x[b, k])`` over the (valid) batch rows of all ranks -> ``[1, K]``."""
    if row_valid is None:
        peak = _all_reduce_max(_local_max(x, dim=0))
        return peak + torch.log(all_reduce_sum(_exp(x - peak).sum(dim=0, keepdim=True)))
    keep = row_valid[:, None]
    peak = _all_reduce_max(_local_max(x.masked_fill(~keep, float("-inf")), dim=0))
    mass = torch.where(keep, _exp(x - peak), 0.0)  # where, not a product: a padding row's inf stays out
    return peak + torch.log(all_reduce_sum(mass.sum(dim=0, keepdim=True)))


def _valid_peak(x: Tensor, row_valid: Tensor | None) -> Tensor:
    """The largest logit of the (valid) rows of all ranks; ``-inf`` where there is none."""
    if row_valid is None or not x.numel():
        return _all_reduce_max(_local_max(x))
    return _all_reduce_max(x.amax(dim=1).masked_fill(~row_valid, float("-inf")).max())


@torch.no_grad()
def sinkhorn_knopp(teacher_logits: Tensor, temperature: float, n_iters: int = 3,
                   logit_bound: float | None = None, row_valid: Tensor | None = None) -> Tensor:
    """Sinkhorn-Knopp teacher targets, ``[B, K]`` logits -> ``[B, K]`` probabilities (rows sum to 1).

    ``Q = exp(t / T)^T`` (``[K, B]``); ``Q /= sum(Q)``; ``n_iters`` times: each prototype row
    divided by its sum and by K, each sample column by its sum and by B_global; finally ``Q * B``,
    transposed. DINOv2 / SwAV; paper 003 Table A2 (3 iterations, teacher temperature 0.04).
    After the last step every sample's row sums to 1 and each prototype's mass tends to B/K.
    Each division by a constant (the total, K, B_global) is followed by a normalisation that does
    not see the scale (the row sums, then the column sums), and the last ``/ B`` is undone by the
    final ``* B``: they are skipped, so neither B_global (a collective and a host read per call
    under several processes) nor the total is needed; the result is the reference's.
    Computed and returned in float32 (float64 if given), autocast off. A rank with no rows
    (``B = 0``: no masked patch in its share of the batch) takes part in every all-reduce and gets
    ``[0, K]``; no row anywhere -> ``[0, K]``.
    When ``(max t - min t) / T <= 60`` (the usual case: the
    DINO head's last layer is weight-normalised, so its logits are bounded) it runs in the exp
    domain after subtracting the global max, as DINOv2 does; otherwise the same arithmetic runs in
    the log domain (each division a logsumexp subtraction), so no input overflows or underflows.
    ``logit_bound``: a known bound on ``|t|`` (1 for the DINO head: cosines). When
    ``2 * logit_bound / T <= 60`` the exp domain is chosen without reading the logits' range
    back (a host sync on a GPU); with value checks off (``validation.set_checks``) and no such
    bound the log domain is used, again with no host sync.
    ``row_valid: bool[B]``: False for padding rows (a batch's fixed shapes), which get no mass, take no
    part in any sum and come back as zero rows: the valid rows' targets are those of the batch without them.
    """
    check_scores("sinkhorn_knopp", teacher_logits)
    if temperature <= 0 or n_iters < 1:
        raise ValueError(f"sinkhorn_knopp: need temperature > 0 and n_iters >= 1, got "
                         f"{temperature}, {n_iters}")
    x = fp32(teacher_logits.detach())
    if x.shape[0] == 0 and not is_distributed():
        return x.clone()
    with no_autocast(x):
        if row_valid is not None:
            row_valid = row_valid.to(x.device)
        peak = _valid_peak(x, row_valid)
        if logit_bound is not None and 2.0 * logit_bound / temperature <= _EXP_SAFE_SPAN:
            exp_domain = True
        elif checks_enabled():
            exp_domain = float((peak + _all_reduce_max(_local_max(-x))) / temperature) <= _EXP_SAFE_SPAN
        else:
            exp_domain = False
        if exp_domain:
            return _sinkhorn_exp(x, peak, temperature, n_iters, row_valid)
        log_q = x / temperature  # [B, K]: log Q^T up to a constant
        for _ in range(n_iters):
            log_q = log_q - _global_logsumexp_over_batch(log_q, row_valid)
            log_q = log_q - _logsumexp_rows(log_q)
        return _exp(log_q) if row_valid is None else torch.where(row_valid[:, None], _exp(log_q), 0.0)


# exp(-60) ~ 9e-27: after a column normalisation over B_global rows (~1e6 at paper scale) entries
# stay well above float32's smallest normal, so the exp domain is exact; wider ranges use the log domain.
_EXP_SAFE_SPAN = 60.0


def _sinkhorn_exp(x: Tensor, peak: Tensor, temperature: float, n_iters: int,
                  row_valid: Tensor | None = None) -> Tensor:
    """DINOv2's form: one exp pass, then in-place divisions (~10x cheaper than two logsumexps
    per iteration on CPU). Caller guarantees ``(max t - min t) / T <= _EXP_SAFE_SPAN``."""
    q = torch.exp((x - peak) / temperature)  # [B, K]; max entry 1, min >= exp(-span)
    if row_valid is None:
        for _ in range(n_iters):
            q /= all_reduce_sum(q.sum(dim=0, keepdim=True))  # each prototype's mass over all ranks
            q /= q.sum(dim=1, keepdim=True)  # each sample's row sums to 1
        return q
    # padding rows hold no mass (where: their exp may be inf when no row is valid); a sum of none is
    # floored so that it divides nothing into NaN (a valid row's sums are >= e^-60 / B_global, far above)
    q = torch.where(row_valid[:, None], q, 0.0)
    tiny = torch.finfo(q.dtype).tiny
    for _ in range(n_iters):
        q /= all_reduce_sum(q.sum(dim=0, keepdim=True)).clamp_min(tiny)
        q /= q.sum(dim=1, keepdim=True).clamp_min(tiny)
    return q


class TeacherCentering(nn.Module):
    """Holds the EMA centre ``[1, K]`` and turns teacher logits into targets (DINO and iBOT)."""

    def __init__(self, out_dim: int, center_momentum: float = 0.9) -> None:
        super().__init__()
        if out_dim < 1 or not 0.0 <= center_momentum <= 1.0:
            raise ValueError(f"need out_dim >= 1 and center_momentum in [0, 1], got {out_dim}, "
                             f"{center_momentum}")
        self.out_dim = out_dim
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    @torch.no_grad()
    def teacher_probs(self, teacher_logits: Tensor, teacher_temp: float,
                      centering: str = "sinkhorn_knopp", n_iters: int = 3,
                      logit_bound: float | None = None, row_valid: Tensor | None = None) -> Tensor:
        """``[B, K]`` teacher logits -> ``[B, K]`` targets; ``row_valid``: False for padding rows, which
        neither Sinkhorn-Knopp nor the centre counts (their targets are zeros or unused).

        ``"softmax"``: ``softmax((t - c) / T)`` with the current centre c, then
        ``c <- m c + (1 - m) mean_batch(t)`` (mean over all ranks), so step k uses step k-1's
        centre (DINOv2). ``"sinkhorn_knopp"``: ``sinkhorn_knopp(t, T, n_iters, logit_bound)``; the
        centre is left alone.
        """
        name = type(self).__name__
        check_scores(f"{name}.teacher_probs", teacher_logits)
        if teacher_logits.shape[-1] != self.out_dim:
            raise ValueError(f"{name}: teacher logits shape {tuple(teacher_logits.shape)} does not "
                             f"match out_dim {self.out_dim}")
        if centering == "sinkhorn_knopp":
            return sinkhorn_knopp(teacher_logits, teacher_temp, n_iters, logit_bound, row_valid)
        if centering != "softmax":
            raise ValueError(f"{name}: centering must be 'softmax' or 'sinkhorn_knopp', "
                             f"got {centering!r}")
        if teacher_temp <= 0:
            raise ValueError(f"{name}: teacher_temp must be > 0, got {teacher_temp}")
        t = fp32(teacher_logits.detach())
        with no_autocast(t):
            probs = torch.softmax((t - self.center.to(device=t.device, dtype=t.dtype)) / teacher_temp, dim=-1)
        self.update_center(t, row_valid)
        return probs

    @torch.no_grad()
    def update_center(self, teacher_logits: Tensor, row_valid: Tensor | None = None) -> None:
        """EMA of the global batch mean of the (valid) teacher logits (float32 whatever their dtype)."""
        if row_valid is not None:
            self._update_center_valid(fp32(teacher_logits.detach()), row_valid.to(teacher_logits.device))
            return
        total = all_reduce_sum(fp32(teacher_logits.detach()).sum(dim=0, keepdim=True))
        if not is_distributed():  # the row count is known on the host: no sync
            if teacher_logits.shape[0] == 0:
                return
            count = teacher_logits.shape[0]
            batch_mean = (total / count).to(self.center.device)
            self.center.mul_(self.center_momentum).add_(batch_mean, alpha=1.0 - self.center_momentum)
            return
        # the masked-patch count differs per rank: all-reduced, and kept a tensor (no host read);
        # no row on any rank (no masked patch) leaves the centre as it is
        count = all_reduce_sum(torch.tensor(float(teacher_logits.shape[0]), device=total.device))
        moved = self.center * self.center_momentum + (total / count.clamp(min=1)).to(self.center.device) * (
            1.0 - self.center_momentum)
        self.center.copy_(torch.where(count.to(self.center.device) > 0, moved, self.center))

    def _update_center_valid(self, t: Tensor, row_valid: Tensor) -> None:
        """:meth:`update_center` over the rows ``row_valid`` flags; the count stays a tensor (no host read)."""
        keep = row_valid[:, None]
        total = all_reduce_sum(torch.where(keep, t, 0.0).sum(dim=0, keepdim=True))
        count = all_reduce_sum(row_valid.sum().to(t.dtype))
        moved = self.center * self.center_momentum + (total / count.clamp(min=1)).to(self.center.device) * (
            1.0 - self.center_momentum)
        self.center.copy_(torch.where(count.to(self.center.device) > 0, moved, self.center))
