"""grpolab.algo.gae against hand-computed values and a naive per-row loop: GAE with gamma and lambda, the end of a
completion as terminal, masked tokens (padding, and environment tokens inside a completion) skipped; token rewards
with the per-token KL; whitening; the clipped value loss and its gradient."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.algo.gae import clipped_value_loss, explained_variance, gae, masked_moments, token_rewards, whiten


def test_gae_equals_a_hand_computed_example():
    # model tokens at 0, 1, 3; column 2 is an environment token inside the completion, column 4 padding
    mask = torch.tensor([[1, 1, 0, 1, 0]])
    rewards = torch.tensor([[0.0, 0.0, 5.0, 1.0, 3.0]], dtype=torch.float64)  # masked columns' values are ignored
    values = torch.tensor([[0.5, 0.4, 9.0, 0.8, 7.0]], dtype=torch.float64)
    out = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # t=3: delta = 1 + 0.9*0 (terminal) - 0.8 = 0.2                 A = 0.2
    # t=1: delta = 0 + 0.9*0.8 - 0.4 = 0.32                          A = 0.32 + 0.45*0.2 = 0.41
    # t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14                         A = -0.14 + 0.45*0.41 = 0.0445
    assert out.advantages[0].tolist() == pytest.approx([0.0445, 0.41, 0.0, 0.2, 0.0], abs=1e-12)
    assert out.returns[0].tolist() == pytest.approx([0.5445, 0.81, 0.0, 1.0, 0.0], abs=1e-12)


def test_gamma_one_lambda_one_gives_the_reward_to_go_minus_the_value():
    mask = torch.tensor([[1, 1, 1, 0]])
    f64 = torch.float64
    out = gae(
        torch.tensor([[-0.1, -0.2, 1.0, 0.0]], dtype=f64),
        torch.tensor([[0.3, 0.6, 0.9, 4.0]], dtype=f64),
        mask,
        1.0,
        1.0,
    )
    assert out.returns[0].tolist() == pytest.approx([0.7, 0.8, 1.0, 0.0], abs=1e-12)  # Monte Carlo returns
    assert out.advantages[0].tolist() == pytest.approx([0.4, 0.2, 0.1, 0.0], abs=1e-12)


def naive_gae(rewards, values, mask, gamma, lam):
    """Row by row over the list of model tokens, in Python floats."""
    adv = [[0.0] * rewards.shape[1] for _ in range(rewards.shape[0])]
    for i in range(rewards.shape[0]):
        cols = [t for t in range(rewards.shape[1]) if mask[i, t]]
        a_next, v_next = 0.0, 0.0
        for t in reversed(cols):
            delta = float(rewards[i, t]) + gamma * v_next - float(values[i, t])
            a_next = delta + gamma * lam * a_next
            v_next = float(values[i, t])
            adv[i][t] = a_next
    return torch.tensor(adv, dtype=torch.float64)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.8, 0.0), (0.5, 0.7)])
def test_gae_equals_a_naive_loop(gamma, lam):
    g = torch.Generator().manual_seed(3)
    n, t = 9, 12
    rewards = torch.randn(n, t, generator=g, dtype=torch.float64)
    values = torch.randn(n, t, generator=g, dtype=torch.float64)
    mask = (torch.rand(n, t, generator=g) < 0.7).long()
    mask[0] = 0  # a row without model tokens
    mask[1, 5:] = 0  # right padding
    out = gae(rewards, values, mask, gamma, lam)
    ref = naive_gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(out.advantages, ref, atol=1e-12, rtol=0)
    assert torch.allclose(out.returns, (ref + values) * mask, atol=1e-12, rtol=0)


def test_token_rewards_put_the_kl_on_every_model_token_and_the_reward_on_the_last():
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 7.0, 0.3, 9.0], [1.0] * 5, [0.4, 1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    r = token_rewards(torch.tensor([2.0, 5.0, -1.0]), kl, mask, beta=0.5)
    want = torch.tensor([[-0.05, -0.1, 0.0, 1.85, 0.0], [0.0] * 5, [-1.2, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(r, want, atol=1e-12, rtol=0)
    assert token_rewards(torch.tensor([2.0, 5.0, -1.0]), None, mask, 0.5)[0].tolist() == [0.0, 0.0, 0.0, 2.0, 0.0]


def test_whitening_uses_the_masked_tokens_of_the_whole_batch():
    x = torch.tensor([[1.0, 3.0, 100.0], [5.0, 7.0, -50.0]], dtype=torch.float64)
    m = torch.tensor([[1, 1, 0], [1, 1, 0]])
    w = whiten(x, m)  # mean 4, population variance 5
    r5 = math.sqrt(5)
    assert torch.allclose(
        w, torch.tensor([[-3 / r5, -1 / r5, 0.0], [1 / r5, 3 / r5, 0.0]], dtype=torch.float64), atol=1e-8
    )
    split = torch.cat(
        [
            whiten(x[:1], m[:1], masked_moments(x, m)),
            whiten(x[1:], m[1:], masked_moments(x[:1], m[:1]) + masked_moments(x[1:], m[1:])),
        ]
    )
    assert torch.allclose(split, w, atol=1e-15)  # statistics summed over parts (ranks) = the whole batch's


def test_clipped_value_loss_equals_hand_values_and_its_gradient():
    v = torch.tensor([1.0, 0.1, -1.0, 3.0], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([0.0, 0.0, 0.0, 2.0], dtype=torch.float64)
    ret = torch.tensor([2.0, 2.0, -2.0, 2.1], dtype=torch.float64)
    out = clipped_value_loss(v, old, ret, 0.2)
    # 1: max((1-2)^2, (0.2-2)^2) = 3.24; 2: inside the clip, 3.61; 3: max(1, (-0.2+2)^2) = 3.24; 4: max(0.81, 0.01)
    assert out.loss.tolist() == pytest.approx([1.62, 1.805, 1.62, 0.405], abs=1e-12)
    assert out.clipped.tolist() == [True, False, True, False]
    out.loss.sum().backward()
    assert v.grad.tolist() == pytest.approx([0.0, -1.9, 0.0, 0.9], abs=1e-12)  # a clipped value gets no gradient
    assert clipped_value_loss(v.detach(), old, ret, 0.0).loss.tolist() == pytest.approx([0.5, 1.805, 0.5, 0.405])


def test_explained_variance_equals_hand_values():
    """G = [2, 4] (Var 1), G - V = [1, 2] (Var 0.25) on the masked tokens: 1 - 0.25 / 1; constant returns: nan."""
    values, mask = torch.tensor([[1.0, 2.0, 0.0]]), torch.tensor([[1, 1, 0]])
    assert explained_variance(values, torch.tensor([[2.0, 4.0, 9.0]]), mask) == pytest.approx(0.75, abs=1e-12)
    assert math.isnan(explained_variance(values, torch.tensor([[3.0, 3.0, 9.0]]), mask))
