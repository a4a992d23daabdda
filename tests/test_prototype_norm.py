"""The DINO head's prototype normalisation (``normalize_rows``, a hand-written backward) against
``F.normalize`` and float64 gradcheck, and the head's shared call split into DINO / iBOT rows."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gsdistill.models.heads import DINOHead, normalize_rows


def test_normalize_rows_equals_f_normalize_values_and_gradients():
    torch.manual_seed(0)
    w = torch.randn(37, 11, dtype=torch.float64)
    w[3] *= 1e-9  # a row shorter than eps: divided by eps, as F.normalize does
    grad = torch.randn_like(w)
    ours, ref = w.clone().requires_grad_(), w.clone().requires_grad_()
    out = normalize_rows(ours, 1e-6)
    torch.testing.assert_close(out, F.normalize(ref, dim=-1, eps=1e-6), rtol=0, atol=1e-15)
    out.backward(grad)
    F.normalize(ref, dim=-1, eps=1e-6).backward(grad)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-12, atol=1e-12)
    assert ours.grad[3].abs().max() > 1e5  # the clamped row's gradient is grad / eps, not projected


def test_normalize_rows_gradcheck_float64():
    torch.manual_seed(1)
    w = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: normalize_rows(x, 1e-6), (w,))


def test_normalize_rows_refuses_a_second_derivative():
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(normalize_rows(w).sum(), w, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        g.sum().backward()


def test_dino_head_logits_are_cosines_to_normalised_prototypes():
    torch.manual_seed(2)
    head = DINOHead(12, out_dim=64, hidden_dim=16, bottleneck_dim=8).double()
    x = torch.randn(5, 12, dtype=torch.float64)
    z = F.normalize(head.mlp(x), dim=-1, eps=1e-6)
    expected = z @ F.normalize(head.prototypes, dim=-1, eps=1e-6).T
    torch.testing.assert_close(head(x), expected, rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda p: F.linear(z.detach(), normalize_rows(p)),
                                    (head.prototypes.detach().clone().requires_grad_(),))
