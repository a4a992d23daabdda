"""Wasserstein loss: the sparse exact cross term equals the dense product (values and gradients)."""
from __future__ import annotations

import pytest
import torch

from gsdistill.losses import WassersteinLoss, wasserstein_loss
from gsdistill.losses.wasserstein import sparse_centred_cross


def graded(b, n, seed, levels=(3.0, 2.0, 1.0), max_pos=5, empty_rows=()):
    g = torch.Generator().manual_seed(seed)
    scores = 2 * torch.randn(b, n, generator=g, dtype=torch.float64)
    labels = torch.zeros(b, n, dtype=torch.float64)
    for row in range(b):
        if row in empty_rows:
            continue
        k = int(torch.randint(1, max_pos + 1, (1,), generator=g))
        picks = torch.randperm(n, generator=g)[:k]
        labels[row, picks] = torch.tensor(levels, dtype=torch.float64)[torch.randint(0, len(levels), (k,), generator=g)]
    return scores, labels


@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (1, 0.5), (2, 3.0)])
def test_sparse_cross_equals_dense_product(seed, temperature):
    scores, labels = graded(9, 40, seed, empty_rows=(4,))  # a row without grades is dropped on both paths
    for valid in (None, (torch.arange(40) < 33).expand(9, 40).clone()):  # same padding in every row
        fast = wasserstein_loss(scores, labels, valid, temperature)
        dense = wasserstein_loss(scores, labels, valid, temperature, dense=True)
        torch.testing.assert_close(fast, dense, rtol=1e-10, atol=1e-12)


def test_sparse_cross_matrix_is_the_centred_product():
    torch.manual_seed(0)
    x, y = torch.softmax(torch.randn(6, 20, dtype=torch.float64), 1), torch.zeros(6, 20, dtype=torch.float64)
    idx = torch.stack([torch.randperm(20)[:3] for _ in range(6)])
    s_vals = torch.rand(6, 3, dtype=torch.float64)
    c = torch.rand(6, 1, dtype=torch.float64)
    y += c  # constant per row ...
    y.scatter_add_(1, idx, s_vals)  # ... plus a sparse part
    xc, yc = x - x.mean(0), y - y.mean(0)
    torch.testing.assert_close(sparse_centred_cross(x, idx, s_vals), xc @ yc.T, rtol=1e-12, atol=1e-14)


def test_different_padding_per_row_takes_the_dense_path_and_gradients_agree():
    scores, labels = graded(7, 30, 3)
    valid = torch.rand(7, 30, generator=torch.Generator().manual_seed(3)) < 0.8
    valid |= labels > 0
    value = wasserstein_loss(scores, labels, valid)
    torch.testing.assert_close(value, wasserstein_loss(scores, labels, valid, dense=True), rtol=0, atol=0)
    s1, s2 = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    grad_fast = torch.autograd.grad(wasserstein_loss(s1, labels), s1)[0]
    grad_dense = torch.autograd.grad(wasserstein_loss(s2, labels, dense=True), s2)[0]
    torch.testing.assert_close(grad_fast, grad_dense, rtol=1e-9, atol=1e-12)


def test_fast_path_gradcheck():
    scores, labels = graded(5, 12, 4, max_pos=3)
    scores.requires_grad_()
    valid = (torch.arange(12) < 10).expand(5, 12).clone()
    assert torch.autograd.gradcheck(lambda s: WassersteinLoss(0.7)(s, labels, valid), (scores,))
    assert torch.autograd.gradcheck(lambda s: wasserstein_loss(s, labels), (scores,))
