"""Wasserstein loss: the fast exact path (sparse targets, sparse cross term, Gram eigh, hand-written
backward) equals the dense reference and the textbook formula, values and gradients."""
from __future__ import annotations

import pytest
import torch

from gsdistill.losses import WassersteinLoss, wasserstein_loss
from gsdistill.losses.wasserstein import _double_centre, _nuclear_norm, sparse_centred_cross


def graded(b, n, seed, levels=(3.0, 2.0, 1.0), max_pos=5, empty_rows=(), scale=2.0):
    g = torch.Generator().manual_seed(seed)
    scores = scale * torch.randn(b, n, generator=g, dtype=torch.float64)
    labels = torch.zeros(b, n, dtype=torch.float64)
    for row in range(b):
        if row in empty_rows:
            continue
        k = int(torch.randint(1, max_pos + 1, (1,), generator=g))
        picks = torch.randperm(n, generator=g)[:k]
        labels[row, picks] = torch.tensor(levels, dtype=torch.float64)[torch.randint(0, len(levels), (k,), generator=g)]
    return scores, labels


def value_and_grad(scores, labels, valid=None, temperature=1.0, dense=False):
    leaf = scores.clone().requires_grad_(True)
    value = wasserstein_loss(leaf, labels, valid, temperature, dense=dense)
    (grad,) = torch.autograd.grad(value, leaf)
    return value.detach(), grad


def assert_fast_equals_dense(scores, labels, valid=None, temperature=1.0):
    value, grad = value_and_grad(scores, labels, valid, temperature)
    ref_value, ref_grad = value_and_grad(scores, labels, valid, temperature, dense=True)
    assert value.dtype == ref_value.dtype == scores.dtype
    torch.testing.assert_close(value, ref_value, rtol=1e-10, atol=0.0)
    torch.testing.assert_close(grad, ref_grad, rtol=0.0, atol=1e-9 * float(ref_grad.abs().max()))
    return value, grad


@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (1, 0.5), (2, 3.0)])
def test_sparse_cross_equals_dense_product(seed, temperature):
    scores, labels = graded(9, 40, seed, empty_rows=(4,))  # a row without grades is dropped on both paths
    for valid in (None, (torch.arange(40) < 33).expand(9, 40).clone()):  # same padding in every row
        fast = wasserstein_loss(scores, labels, valid, temperature)
        dense = wasserstein_loss(scores, labels, valid, temperature, dense=True)
        torch.testing.assert_close(fast, dense, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (1, 0.5), (2, 3.0), (3, 0.2)])
@pytest.mark.parametrize("padded", [False, True])
def test_fast_path_equals_dense_in_value_and_gradient(seed, temperature, padded):
    # small batches (one thin SVD) and batches over 32 rows (the Gram eigh + thin SVD of the lowest)
    for b, n, scale in ((9, 40, 2.0), (70, 300, 3.0)):
        scores, labels = graded(b, n, seed, empty_rows=(4, 7), scale=scale)
        valid = None
        if padded:  # the same padding in every row; grades there are ignored (masked) on both paths
            valid = (torch.arange(n) % 7 != 3).expand(b, n).clone()
        value, grad = assert_fast_equals_dense(scores, labels, valid, temperature)
        assert value > 0
        assert torch.all(grad[[4, 7]] == 0)  # rows without grades are left out
        if padded:
            assert torch.all(grad[:, 3] == 0)


def test_fast_path_equals_dense_for_one_two_and_duplicate_rows():
    scores, labels = graded(9, 40, 5)
    assert_fast_equals_dense(scores, labels * (torch.arange(9)[:, None] == 2))  # n = 1: mean term only
    assert_fast_equals_dense(scores, labels * (torch.arange(9)[:, None] < 2))  # n = 2
    scores[3], labels[3] = scores[1], labels[1]  # a duplicate anchor: M gets a second null direction
    assert_fast_equals_dense(scores, labels)
    labels[0] = 1.0  # a row whose candidates are all graded (no grade-0 constant)
    assert_fast_equals_dense(scores, labels, temperature=0.7)
    assert_fast_equals_dense(*graded(40, 12, 6, max_pos=2))  # more anchors than candidates: M rank-deficient


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


@pytest.mark.parametrize("n,low", [(20, 1e-9), (100, 1e-4), (100, 1e-8), (100, 1e-12)])
def test_nuclear_norm_and_polar_factor_match_the_svd(n, low):
    # doubly centred M with a known spectrum (geometric, sigma_max / sigma_min = 1 / low) + the null e
    g = torch.Generator().manual_seed(n)
    basis = torch.linalg.qr(torch.eye(n, dtype=torch.float64) - 1.0 / n)[0][:, : n - 1]  # 1^perp
    u = torch.linalg.qr(torch.randn(n - 1, n - 1, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(n - 1, n - 1, generator=g, dtype=torch.float64))[0]
    sigma = 3e-3 * torch.logspace(0, float(torch.log10(torch.tensor(low))), n - 1, dtype=torch.float64)
    m = basis @ u @ torch.diag(sigma) @ v.T @ basis.T
    nuclear, left, right = _nuclear_norm(m)
    under = int((sigma < sigma[0] * (8 * n * torch.finfo(torch.float64).eps) ** 0.5).sum())
    if under < 32:  # the noise floor of the Gram is inside the thin-SVD block: every sigma counts
        torch.testing.assert_close(nuclear, sigma.sum(), rtol=1e-12, atol=0.0)
    else:  # more directions under it than the block holds: those count as 0
        assert 0 < sigma.sum() - nuclear < under * sigma[0] * 1e-6
    if low >= 1e-4:  # polar factor U V^T: float64-exact for a moderately conditioned M
        polar = basis @ u @ v.T @ basis.T
        torch.testing.assert_close(_double_centre(left @ right.T), polar, rtol=0.0, atol=1e-9)


def test_value_is_the_textbook_formula_with_covariance_square_roots():
    # tiny case: D x D covariances, matrix square roots by eigh. Rows sum to 1 (and padding is 0),
    # so both covariances vanish on 1 and on the padding: taken out by an orthonormal basis first,
    # the covariances are full rank (n - 1 >= D - 2) and their square roots float64-accurate.
    scores, labels = graded(14, 7, 11, max_pos=3, empty_rows=(5,), scale=1.5)
    valid = (torch.arange(7) != 6).expand(14, 7).clone()
    temperature = 0.8
    used = labels[:, :6].sum(1) > 0
    x = torch.softmax(scores[used, :6], 1)
    y = torch.softmax(labels[used, :6] / temperature, 1)
    basis = torch.linalg.qr(torch.eye(6, dtype=torch.float64) - 1.0 / 6)[0][:, :5]

    def sqrtm(c):
        lam, vec = torch.linalg.eigh(c)
        assert lam.min() > 1e-10 * lam.max()  # full rank: no square root of noise
        return vec @ torch.diag(lam.sqrt()) @ vec.T

    cx, cy = (torch.cov(z.T) for z in (x @ basis, y @ basis))
    root = sqrtm(cx)
    textbook = ((x.mean(0) - y.mean(0)) ** 2).sum() + torch.trace(cx + cy - 2 * sqrtm(root @ cy @ root))
    fast = wasserstein_loss(scores, labels, valid, temperature)
    torch.testing.assert_close(fast, textbook, rtol=1e-11, atol=0.0)


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
    # a row without grades, a label temperature, more than 32 anchors (the eigh path)
    scores, labels = graded(36, 10, 8, max_pos=3, empty_rows=(2,))
    scores.requires_grad_()
    assert torch.autograd.gradcheck(lambda s: wasserstein_loss(s, labels, None, 0.6), (scores,))


def test_float32_input_returns_float32_close_to_float64():
    scores, labels = graded(48, 256, 9, scale=3.0)
    ref_value, ref_grad = value_and_grad(scores.float().double(), labels)  # same inputs, float64
    value, grad = value_and_grad(scores.float(), labels.float())
    assert value.dtype == grad.dtype == torch.float32
    assert value.item() == pytest.approx(ref_value.item(), rel=1e-6)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0.0, atol=1e-6 * float(ref_grad.abs().max()))
    # computed in float64 inside: the float32 result is the float64 one rounded
    dense_value, dense_grad = value_and_grad(scores.float(), labels.float(), dense=True)
    assert value.item() == dense_value.item()
    torch.testing.assert_close(grad, dense_grad, rtol=1e-6, atol=1e-9 * float(dense_grad.abs().max()))
