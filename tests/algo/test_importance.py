"""Sampler/trainer mismatch correction weights (grpolab.algo.importance)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpolab.algo.importance import IS_CORRECTIONS, ISMode, ISParams, is_weights, mismatch_stats

P = ISParams(c_max=2.0, c_min=0.5)

# ratios pi_old / q per token; masked tokens carry junk ratios that must not matter
#   row 0: [.4, 1.25, 2.4, (100 masked)]  product 1.2
#   row 1: [2.5, 1.2, (7 masked), (7 masked)]  product 3
#   row 2: [.3, .8, (.01 masked), (1 masked)]  product .24
#   row 3: fully masked
HAND_RATIOS = [[0.4, 1.25, 2.4, 100.0], [2.5, 1.2, 7.0, 7.0], [0.3, 0.8, 0.01, 1.0], [3.0, 0.1, 1.0, 5.0]]
HAND_MASK = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
HAND_EXPECTED = {
    "none": [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]],
    # min(r, 2)
    "token_truncate": [[0.4, 1.25, 2.0, 0], [2.0, 1.2, 0, 0], [0.3, 0.8, 0, 0], [0, 0, 0, 0]],
    # r if .5 <= r <= 2 else 0
    "token_mask": [[0.0, 1.25, 0.0, 0], [0.0, 1.2, 0, 0], [0.0, 0.8, 0, 0], [0, 0, 0, 0]],
    # min(prod, 2): 1.2, 2, .24
    "sequence_truncate": [[1.2, 1.2, 1.2, 0], [2.0, 2.0, 0, 0], [0.24, 0.24, 0, 0], [0, 0, 0, 0]],
    # prod if prod <= 2 else 0 (masked IS above C only, as published and TRL): 1.2, 0 (3), .24 (kept: no lower bound)
    "sequence_mask": [[1.2, 1.2, 1.2, 0], [0.0, 0.0, 0, 0], [0.24, 0.24, 0, 0], [0, 0, 0, 0]],
}


def _hand_inputs():
    sampler = torch.tensor(
        [[-1.0, -2.0, -0.5, -3.0], [-0.1, -4.0, -2.0, -1.0], [-2.0, -2.0, -5.0, -0.7], [-1.0] * 4], dtype=torch.float64
    )
    old = sampler + torch.log(torch.tensor(HAND_RATIOS, dtype=torch.float64))
    mask = torch.tensor(HAND_MASK)
    return old, sampler, mask


def test_registry_complete():
    assert set(IS_CORRECTIONS) == set(ISMode)
    assert set(HAND_EXPECTED) == {str(m) for m in ISMode}


@pytest.mark.parametrize("mode", list(ISMode))
def test_hand_values(mode):
    old, sampler, mask = _hand_inputs()
    w = is_weights(old, sampler, mask, mode, P)
    torch.testing.assert_close(w, torch.tensor(HAND_EXPECTED[str(mode)], dtype=torch.float64), rtol=1e-12, atol=1e-12)


def naive_is(mode: str, old, sampler, mask, c_min, c_max):
    B, T = len(old), len(old[0])
    out = [[0.0] * T for _ in range(B)]
    for i in range(B):
        seq = 0.0
        for t in range(T):
            if mask[i][t]:
                seq += old[i][t] - sampler[i][t]
        seq_r = math.exp(min(seq, 50.0))
        for t in range(T):
            if not mask[i][t]:
                continue
            r = math.exp(old[i][t] - sampler[i][t])
            if mode == "none":
                w = 1.0
            elif mode == "token_truncate":
                w = min(r, c_max)
            elif mode == "token_mask":
                w = r if c_min <= r <= c_max else 0.0
            elif mode == "sequence_truncate":
                w = min(seq_r, c_max)
            else:
                w = seq_r if seq_r <= c_max else 0.0
            out[i][t] = w
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("mode", list(ISMode))
def test_random_vs_naive(seed, mode):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    Bn, Tn = rng.randint(1, 6), rng.randint(1, 8)
    sampler = -torch.rand(Bn, Tn, generator=g, dtype=torch.float64) * 5
    old = sampler + torch.randn(Bn, Tn, generator=g, dtype=torch.float64) * rng.choice([0.05, 0.3, 1.0])
    mask = (torch.rand(Bn, Tn, generator=g) < 0.7).long()
    if Bn > 1:
        mask[rng.randrange(Bn)] = 0
    p = ISParams(c_max=rng.choice([1.5, 2.0, 5.0]), c_min=rng.choice([0.2, 0.5, 0.9]))
    w = is_weights(old, sampler, mask, mode, p)
    expected = naive_is(str(mode), old.tolist(), sampler.tolist(), mask.tolist(), p.c_min, p.c_max)
    torch.testing.assert_close(w, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert (w[mask == 0] == 0).all()
    assert (w >= 0).all()
    if mode != ISMode.NONE:
        assert (w <= p.c_max * (1 + 1e-12)).all()


@pytest.mark.parametrize("mode", list(ISMode))
def test_weights_are_detached(mode):
    old, sampler, mask = _hand_inputs()
    old = old.clone().requires_grad_()
    sampler = sampler.clone().requires_grad_()
    w = is_weights(old, sampler, mask, mode, P)
    assert not w.requires_grad
    assert w.grad_fn is None
    # used in a loss, no gradient reaches old / sampler logprobs
    loss = (w * old).sum() + (w * sampler).sum()
    loss.backward()
    torch.testing.assert_close(old.grad, w)
    torch.testing.assert_close(sampler.grad, w)


@pytest.mark.parametrize("mode", list(ISMode))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_log_ratios_finite(mode, dtype):
    sampler = torch.zeros(3, 4, dtype=dtype)
    old = torch.tensor([[60.0, 40.0, 1.0, 0.0], [-1000.0, 0.0, 0.0, 0.0], [200.0, -200.0, 0.0, 0.0]], dtype=dtype)
    mask = torch.ones(3, 4)
    w = is_weights(old, sampler, mask, mode, P)
    assert torch.isfinite(w).all()
    assert (w >= 0).all() and (w <= max(P.c_max, 1.0)).all()
    if mode == ISMode.SEQUENCE_TRUNCATE:
        # row 0: sum 101 -> capped at C; row 1: -1000 -> ~0; row 2: sum 0 -> 1
        torch.testing.assert_close(w[:, 0], torch.tensor([2.0, 0.0, 1.0], dtype=dtype))
    if mode == ISMode.SEQUENCE_MASK:
        torch.testing.assert_close(w[:, 0], torch.tensor([0.0, 0.0, 1.0], dtype=dtype))


def test_masked_tokens_do_not_change_sequence_weights():
    old, sampler, mask = _hand_inputs()
    junk = torch.where(mask.bool(), old, old + 30.0)
    for mode in (ISMode.SEQUENCE_TRUNCATE, ISMode.SEQUENCE_MASK):
        assert torch.equal(is_weights(old, sampler, mask, mode, P), is_weights(junk, sampler, mask, mode, P))


def test_mismatch_stats_hand():
    # diffs on masked tokens: |-1 - -1.5| = .5, |-2 - -1| = 1, |-3 - -3.25| = .25  (masked diff 8.5 ignored)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -1.0]], dtype=torch.float64)
    sampler = torch.tensor([[-1.5, -1.0, -9.0], [-3.25, -5.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # token_truncate C = 2: weights exp(.5) = 1.6487, exp(-1) = .3679, exp(.25) = 1.2840; masked weight 0 ignored
    w = is_weights(old, sampler, mask, ISMode.TOKEN_TRUNCATE, P)
    s = mismatch_stats(old, sampler, mask, w)
    assert set(s) == {
        "sampler/logp_diff_mean",
        "sampler/logp_diff_max",
        "sampler/is_weight_min",
        "sampler/is_weight_mean",
        "sampler/is_weight_max",
    }
    assert s["sampler/logp_diff_mean"] == pytest.approx(1.75 / 3, rel=1e-12)
    assert s["sampler/logp_diff_max"] == pytest.approx(1.0, rel=1e-12)
    assert s["sampler/is_weight_min"] == pytest.approx(math.exp(-1.0), rel=1e-12)
    assert s["sampler/is_weight_max"] == pytest.approx(math.exp(0.5), rel=1e-12)
    assert s["sampler/is_weight_mean"] == pytest.approx(
        (math.exp(0.5) + math.exp(-1.0) + math.exp(0.25)) / 3, rel=1e-12
    )
    # the mismatch is measured whatever the mode
    s_none = mismatch_stats(old, sampler, mask, is_weights(old, sampler, mask, ISMode.NONE, P))
    assert s_none["sampler/logp_diff_mean"] == s["sampler/logp_diff_mean"]
    assert s_none["sampler/is_weight_min"] == s_none["sampler/is_weight_max"] == 1.0


def test_mismatch_stats_empty_mask():
    z = torch.zeros(2, 3)
    assert mismatch_stats(z, z, torch.zeros(2, 3), z) == {}
