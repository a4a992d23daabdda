"""model.ibot_separate_head (DINOv2's ibot.separate_head): iBOT's patch tokens go through their own head, which the
EMA teacher mirrors; DINO keeps the pooled h_p. With the same weights it computes exactly the shared head's terms."""
from __future__ import annotations

import torch

from gsdistill.models.gsdistill_model import GSDistill
from tests.test_pretrain_model import model_and_batch, tiny

SEPARATE = ("model.ibot_separate_head=true",)


def grad_sum(module: torch.nn.Module) -> float:
    return float(sum(p.grad.abs().sum() for p in module.parameters() if p.grad is not None))


def test_each_term_trains_its_own_head():
    model, batch, _ = model_and_batch(None, *SEPARATE)
    assert model.ibot_head_name == "ibot_head" and "ibot_head" in model.teacher
    terms = model(batch)
    terms["ibot"].backward(retain_graph=True)
    assert grad_sum(model.ibot_head) > 0 and grad_sum(model.dino_head) == 0
    model.zero_grad(set_to_none=True)
    terms["distill"].backward()
    assert grad_sum(model.dino_head) > 0 and grad_sum(model.ibot_head) == 0


def test_shared_head_is_the_default_and_ibot_trains_it():
    model, batch, _ = model_and_batch()
    assert model.ibot_head_name == "dino_head" and not hasattr(model, "ibot_head") and "ibot_head" not in model.teacher
    model(batch)["ibot"].backward()
    assert grad_sum(model.dino_head) > 0


def test_teacher_ema_covers_the_ibot_head():
    shared, _, _ = model_and_batch()
    model, _, _ = model_and_batch(None, *SEPARATE)
    n_head = sum(1 for _ in model.ibot_head.parameters())
    assert len(model.teacher_pairs()) == len(shared.teacher_pairs()) + n_head
    with torch.no_grad():
        for p in model.ibot_head.parameters():
            p.add_(1.0)
    before = [t.clone() for t in model.teacher["ibot_head"].parameters()]
    model.update_teacher(0.75)
    for t0, t1, s in zip(before, model.teacher["ibot_head"].parameters(), model.ibot_head.parameters()):
        torch.testing.assert_close(t1, 0.75 * t0 + 0.25 * s)


def test_same_weights_give_the_shared_heads_terms():
    shared, batch, _ = model_and_batch()
    torch.manual_seed(1)
    model = GSDistill(tiny(None, *SEPARATE))
    state = shared.state_dict()
    for k, v in list(state.items()):  # the separate heads start as copies of the shared one
        if k.startswith("dino_head.") or k.startswith("teacher.dino_head."):
            state[k.replace("dino_head.", "ibot_head.", 1)] = v
    model.load_state_dict(state)
    shared.eval(), model.eval()
    a, b = shared(batch), model(batch)
    for term in ("ibot", "distill", "total"):
        torch.testing.assert_close(b[term], a[term])
