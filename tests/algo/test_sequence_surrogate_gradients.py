"""GSPO and GMPO in their token form (issue: a token weight of 0 must remove that token's gradient): float64, against
the sequence-level formulas written out here."""

from __future__ import annotations

import torch

from grpolab.algo.surrogate import ClipParams, gmpo, gspo

P = ClipParams(eps_low=0.2, eps_high=0.28, dual_clip_c=0.0)


def inputs():
    logp = torch.tensor([[-1.0, -0.5, -2.0, -0.7]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.05, -0.45, -2.1, -0.7]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    return logp, old, torch.tensor([0.5], dtype=torch.float64), mask


def sequence_gspo_loss(logp, old, adv, mask):
    """GSPO as published: s = exp(mean_t (logp - old)), l = -min(s A, clip(s) A), the same on every token."""
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    return -torch.minimum(s * adv, s.clamp(1 - P.eps_low, 1 + P.eps_high) * adv)


def test_gspo_token_weight_zero_removes_that_tokens_gradient_and_equal_weights_give_gspos_gradient():
    logp, old, adv, mask = inputs()
    w = torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    (grad,) = torch.autograd.grad((gspo(logp, old, adv, mask, P).loss * w).sum(), logp)
    assert grad[0, 1] == 0 and grad[0, 0] != 0, "a token zeroed by its IS weight or mask has no gradient"
    (grad_equal,) = torch.autograd.grad((gspo(logp, old, adv, mask, P).loss * mask / 3).sum(), logp)
    (expected,) = torch.autograd.grad(sequence_gspo_loss(logp, old, adv, mask).sum(), logp)
    torch.testing.assert_close(grad_equal, expected, rtol=1e-12, atol=1e-15)


def test_gmpo_token_weight_zero_removes_that_tokens_gradient_and_equal_weights_give_gmpos_gradient():
    logp, old, adv, mask = inputs()
    w = torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    (grad,) = torch.autograd.grad((gmpo(logp, old, adv, mask, P).loss * w).sum(), logp)
    assert grad[0, 1] == 0 and grad[0, 0] != 0
    log_r = (logp - old) * mask
    clipped = torch.minimum(log_r, log_r.clamp(-P.eps_low, P.eps_high))  # A > 0: sgn = +1
    expected_loss = -adv * torch.exp((clipped * mask).sum(-1) / mask.sum(-1))
    (expected,) = torch.autograd.grad(expected_loss.sum(), logp)
    (grad_equal,) = torch.autograd.grad((gmpo(logp, old, adv, mask, P).loss * mask / 3).sum(), logp)
    torch.testing.assert_close(grad_equal, expected, rtol=1e-12, atol=1e-15)
