"""Self-distillation and regularisers: Sinkhorn-Knopp, DINO, iBOT, KoLeo, KoLeo-hybrid."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from gsdistill.losses import DINOLoss, IBOTPatchLoss, KoLeoHybridLoss, KoLeoLoss, sinkhorn_knopp


def reference_sinkhorn(logits, temp, n_iters):
    """DINOv2's single-process algorithm, verbatim maths, float64, no max shift."""
    q = torch.exp(logits.double() / temp).t()
    k, b = q.shape
    q = q / q.sum()
    for _ in range(n_iters):
        q = q / q.sum(dim=1, keepdim=True) / k
        q = q / q.sum(dim=0, keepdim=True) / b
    return (q * b).t()


def test_sinkhorn_matches_reference_rows_sum_to_one():
    logits = torch.randn(12, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    probs = sinkhorn_knopp(logits, 0.3, n_iters=3)
    assert torch.allclose(probs, reference_sinkhorn(logits, 0.3, 3), atol=1e-12)
    assert torch.allclose(probs.sum(dim=1), torch.ones(12, dtype=torch.float64), atol=1e-12)
    # with more iterations the prototypes share the mass equally: columns sum to B / K
    converged = sinkhorn_knopp(logits, 0.3, n_iters=500)
    assert torch.allclose(converged.sum(dim=0), torch.full((5,), 12 / 5, dtype=torch.float64), atol=1e-6)
    assert (probs >= 0).all()


def test_sinkhorn_large_logits_stay_finite():
    logits = torch.randn(8, 6, generator=torch.Generator().manual_seed(1)) * 50.0
    probs = sinkhorn_knopp(logits, 0.04, n_iters=3)
    assert probs.dtype == torch.float32 and torch.isfinite(probs).all()
    assert torch.allclose(probs.sum(dim=1), torch.ones(8), atol=1e-5)
    with pytest.raises(ValueError, match="NaN/inf"):
        sinkhorn_knopp(torch.full((2, 3), math.nan), 0.1)


def test_dino_hand_made_case():
    loss = DINOLoss(out_dim=2, student_temp=0.5)
    students = [torch.tensor([[0.0, 0.0]]), torch.tensor([[0.5 * math.log(3.0), 0.0]])]
    teachers = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])]
    # (s0, t1): log 2 ; (s1, t0): -log(3/4)
    assert loss(students, teachers).item() == pytest.approx((math.log(2) + math.log(4 / 3)) / 2, rel=1e-6)
    # diagonal too: (s0, t0) log 2 ; (s1, t1) -log(1/4)
    expected = (2 * math.log(2) + math.log(4 / 3) + math.log(4)) / 4
    assert loss(students, teachers, ignore_diagonal=False).item() == pytest.approx(expected, rel=1e-6)
    # local student views (index >= number of teachers) pair with every teacher
    three = loss(students + [torch.tensor([[0.0, 0.0]])], teachers)
    assert three.item() == pytest.approx((math.log(2) + math.log(4 / 3) + 2 * math.log(2)) / 4, rel=1e-6)


def test_dino_matches_explicit_pair_loop_and_gradcheck():
    g = torch.Generator().manual_seed(2)
    students = [torch.randn(4, 7, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    teachers = [torch.softmax(torch.randn(4, 7, generator=g, dtype=torch.float64), -1) for _ in range(2)]
    loss = DINOLoss(7, student_temp=0.1)
    terms = [-(t * F.log_softmax(s / 0.1, -1)).sum(-1).mean()
             for (i, s), (j, t) in itertools.product(enumerate(students), enumerate(teachers)) if i != j]
    assert torch.allclose(loss(students, teachers), torch.stack(terms).mean(), atol=1e-12)
    assert torch.autograd.gradcheck(lambda *s: loss(list(s), teachers), tuple(students))
    with pytest.raises(ValueError, match="does not match"):
        loss([students[0], students[1][:3]], teachers)


def test_softmax_centering_uses_then_updates_centre():
    loss = DINOLoss(3, center_momentum=0.9)
    t1 = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    p1 = loss.teacher_probs(t1, 0.5, centering="softmax")
    assert torch.allclose(p1, torch.softmax(t1 / 0.5, -1))
    assert torch.allclose(loss.center, torch.tensor([[0.2, 0.2, 0.2]]))
    t2 = torch.tensor([[0.0, 1.0, 0.0]])
    p2 = loss.teacher_probs(t2, 0.5, centering="softmax")
    assert torch.allclose(p2, torch.softmax((t2 - 0.2) / 0.5, -1))
    assert torch.allclose(loss.center, 0.9 * torch.tensor([[0.2, 0.2, 0.2]]) + 0.1 * t2)
    sk = loss.teacher_probs(t1, 0.5)  # sinkhorn default leaves the centre alone
    assert torch.allclose(sk.sum(-1), torch.ones(2)) and torch.allclose(loss.center[0, 1], torch.tensor(0.28))
    with pytest.raises(ValueError, match="centering"):
        loss.teacher_probs(t1, 0.5, centering="sinkhorn")


def test_ibot_hand_made_case_per_image_weights():
    masks = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]], dtype=torch.bool)
    teacher = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    wanted = torch.tensor([0.5, 0.25, 0.8])  # student probability of the teacher's class
    first = torch.where(teacher[:, 0] > 0, wanted, 1 - wanted)
    student = 0.1 * torch.log(torch.stack([first, 1 - first], dim=1))
    ces = -torch.log(wanted)
    expected = (ces[0] / 2 + ces[1] / 2 + ces[2] / 1) / 3  # all 3 images, masked or not (DINOv2)
    loss = IBOTPatchLoss(2, student_temp=0.1)
    assert loss(student, teacher, masks).item() == pytest.approx(expected.item(), rel=1e-5)
    no_mask = torch.zeros(2, 4, dtype=torch.bool)
    empty = loss(torch.zeros(0, 2, requires_grad=True), torch.zeros(0, 2), no_mask)
    assert empty.item() == 0.0
    with pytest.raises(ValueError, match="masks.sum"):
        loss(student[:2], teacher[:2], masks)


def test_ibot_gradcheck():
    masks = torch.tensor([[1, 1, 0], [0, 1, 0]], dtype=torch.bool)
    g = torch.Generator().manual_seed(3)
    student = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.softmax(torch.randn(3, 5, generator=g, dtype=torch.float64), -1)
    assert torch.autograd.gradcheck(lambda s: IBOTPatchLoss(5)(s, teacher, masks), (student,))


def reference_koleo(x, eps=1e-8):
    z = F.normalize(x, dim=-1, eps=eps)
    dist = torch.cdist(z, z) + torch.diag(torch.full((len(z),), math.inf, dtype=z.dtype))
    return -torch.log(dist.min(dim=1).values + eps).mean()


def test_koleo_matches_reference_and_duplicates_are_finite():
    x = torch.randn(10, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert torch.allclose(KoLeoLoss()(x), reference_koleo(x), atol=1e-6)
    assert torch.allclose(KoLeoLoss()(3 * x), KoLeoLoss()(x), atol=1e-12)
    dup = torch.cat([x[:3], x[:3], x[:1]]).clone().requires_grad_(True)
    loss = KoLeoLoss()(dup.float())
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(dup.grad).all()
    assert loss.item() > 15  # -log(~1e-8): duplicates are maximally penalised
    x2 = x[:5].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(KoLeoLoss(), (x2,))


def test_koleo_hybrid_matches_eq1():
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    z = F.normalize(x, dim=-1)
    sims = z @ z.t()
    rep = math.log(sum(math.exp(sims[i, j]) for i in range(6) for j in range(6) if i != j) / 30)
    pairs = [(u, u + 3) for u in range(3)]  # 2 views x 3 pages, view-major
    att = sum(1 - sims[u, v].item() for u, v in pairs) / 3
    loss = KoLeoHybridLoss(alpha=0.7, beta=2.0, n_views=2)
    assert loss(x).item() == pytest.approx(0.7 * rep + 2.0 * att, rel=1e-10)
    groups = torch.tensor([0, 1, 2, 0, 1, 2])
    assert loss(x, groups).item() == pytest.approx(0.7 * rep + 2.0 * att, rel=1e-10)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: loss(t), (x,))
    dup = torch.ones(4, 3, requires_grad=True)
    out = KoLeoHybridLoss(n_views=2)(dup)
    out.backward()
    assert out.item() == pytest.approx(1.0) and torch.isfinite(dup.grad).all()
    with pytest.raises(ValueError, match="multiple of n_views"):
        loss(x[:5])


def test_sinkhorn_exp_and_log_domains_agree(monkeypatch):
    import gsdistill.losses.centering as centering
    logits = torch.randn(16, 300, dtype=torch.float64) * 0.5  # span/T ~ 40: the exp-domain path
    fast = sinkhorn_knopp(logits, 0.1, n_iters=3)
    monkeypatch.setattr(centering, "_EXP_SAFE_SPAN", -1.0)  # force the log-domain path
    slow = sinkhorn_knopp(logits, 0.1, n_iters=3)
    assert torch.allclose(fast, slow, rtol=1e-10, atol=1e-14)
    assert torch.allclose(fast, reference_sinkhorn(logits, 0.1, 3), rtol=1e-10, atol=1e-14)
