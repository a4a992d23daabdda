"""PatchSpreadLoss: VICReg's variance and covariance terms, against a direct formula, gradcheck, and
what it is for (a collapsed token set costs more than a spread one; its gradient spreads it)."""
import pytest
import torch

from gsdistill.losses import PatchSpreadLoss


def reference(x: torch.Tensor, gamma: float, cov_weight: float, eps: float) -> torch.Tensor:
    """Loop form of VICReg eqs. 1 and 3 (Bardes et al. 2022)."""
    n, d = x.shape
    mean = x.mean(0)
    v, c = 0.0, 0.0
    for i in range(d):
        for j in range(d):
            cij = sum((x[k, i] - mean[i]) * (x[k, j] - mean[j]) for k in range(n)) / (n - 1)
            if i == j:
                v = v + torch.relu(gamma - torch.sqrt(cij + eps))
            else:
                c = c + cij ** 2
    return v / d + cov_weight * c / d


def test_matches_the_loop_formula():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 4, generator=g, dtype=torch.float64) * torch.tensor([0.2, 1.5, 0.7, 3.0], dtype=torch.float64)
    x[:, 1] += 0.8 * x[:, 0]  # correlated channels
    loss = PatchSpreadLoss(gamma=1.0, cov_weight=0.3, eps=1e-4)
    assert torch.allclose(loss(x), reference(x, 1.0, 0.3, 1e-4), atol=1e-12)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, generator=g, dtype=torch.float64).mul(0.5).requires_grad_()
    assert torch.autograd.gradcheck(PatchSpreadLoss(cov_weight=0.5), (x,))


def test_zero_for_whitened_tokens_and_large_for_tokens_on_a_line():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(4096, 16, generator=g, dtype=torch.float64)
    z = z - z.mean(0)
    whitened = z @ torch.linalg.inv(torch.linalg.cholesky(torch.cov(z.T))).T * 1.5  # std 1.5 > gamma, C diagonal
    var, cov = PatchSpreadLoss().terms(whitened)
    assert var == 0 and cov < 1e-20
    line = torch.randn(4096, 1, generator=g) * torch.full((16,), 2.0)  # every channel the same: rank 1, std 2
    var, cov = PatchSpreadLoss().terms(line)
    assert var == 0 and cov > 14 * 16  # (D - 1) covariances of ~4 each, squared, per channel


def test_gradient_steps_raise_the_effective_rank_of_collapsed_tokens():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(512, 1, generator=g) * torch.randn(8, generator=g) + 0.01 * torch.randn(512, 8, generator=g))
    x.requires_grad_()

    def erank(t):
        e = torch.linalg.eigvalsh(torch.cov(t.detach().T)).clamp_min(0)
        p = e / e.sum()
        return float(torch.exp(-(p[p > 0] * p[p > 0].log()).sum()))
    before = erank(x)
    opt = torch.optim.SGD([x], lr=100.0)  # the loss is a mean over 512 tokens x 8 channels: per-token gradients are small
    loss = PatchSpreadLoss()
    for _ in range(300):
        opt.zero_grad()
        loss(x).backward()
        opt.step()
    assert before < 1.5 and erank(x) > 6


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="PatchSpreadLoss"):
        PatchSpreadLoss()(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="gamma"):
        PatchSpreadLoss(gamma=0)
