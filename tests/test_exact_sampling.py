"""Exact sampling (grpolab/rollout/decode.py): the decode loops' uniforms are float64, so P(token) is the softmax
down to probabilities far below float32's 2^-24 grid, and non-finite logits are an error naming the row.

Before the fix the uniforms were float32 (k * 2^-24): a token whose CDF interval held no grid point was never
drawn, one whose interval held one was drawn with probability 2^-24 whatever its own (logits log([0.5, 1e-9, 0.5])
drew the middle token 60x too often); NaN / +inf logits silently gave token V-1."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab.errors import GrpolabError
from grpolab.rollout.decode import NonFiniteLogitsError, decode_groups, inverse_cdf, sample_tokens, uniforms

GRID32 = 2.0**-24  # the spacing of torch.rand's float32 uniforms


@pytest.mark.parametrize("seeded", [False, True])
def test_the_uniforms_are_float64_and_fill_the_gaps_of_the_float32_grid(seeded):
    """frac(u * 2^24), where u sits inside float32's 2^-24 grid, is uniform on [0, 1) (chi-square, 16 bins, df 15:
    the 0.1% critical value is 37.7); float32 uniforms give 0 for every draw."""
    gens = [torch.Generator().manual_seed(s) for s in range(8)] if seeded else None
    torch.manual_seed(0)
    u = torch.cat([uniforms(64, 8, gens) for _ in range(256)])  # 16,384 draws
    assert u.dtype == torch.float64 and u.shape == (16_384,) and 0.0 <= u.min() and u.max() < 1.0
    frac = torch.frac(u * 2**24)
    counts = torch.bincount((frac * 16).long(), minlength=16).double()
    expected = len(u) / 16
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 37.7, (chi2, counts.tolist())


def test_each_group_keeps_its_own_stream():
    """The per-prompt generators' contract: group i's uniforms are its generator's draws, in order, whatever the
    other groups; the same seeds give the same numbers."""
    a = uniforms(6, 3, [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)])
    b = uniforms(6, 3, [torch.Generator().manual_seed(7), torch.Generator().manual_seed(2)])
    again = uniforms(6, 3, [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)])
    assert torch.equal(a, again) and torch.equal(a[3:], b[3:]) and not torch.equal(a[:3], b[:3])
    assert torch.equal(a[:3], torch.rand(3, generator=torch.Generator().manual_seed(1), dtype=torch.float64))


def token_interval(logits: torch.Tensor, token: int) -> float:
    """The length of {u in [0, 1): sample_tokens(logits, u) = token} (it is an interval: the token is a monotone
    function of u), found by bisection on float64 u: the probability of the token under uniform u."""

    def tok(u: float) -> int:
        return int(sample_tokens(logits, 1.0, torch.tensor([u], dtype=torch.float64))[0])

    def first_u(pred) -> float:  # smallest u with pred(tok(u)), to float64 resolution
        lo, hi = 0.0, 1.0 - 2**-53
        for _ in range(200):
            mid = (lo + hi) / 2
            if mid in (lo, hi):
                break
            lo, hi = (lo, mid) if pred(tok(mid)) else (mid, hi)
        return hi

    return first_u(lambda t: t > token) - first_u(lambda t: t >= token)


def test_a_token_of_probability_1e9_has_exactly_its_probability():
    """logits log([0.5, 1e-9, 0.5]): the middle token's set of uniforms has length 1e-9 / (1 + 1e-9) (the float32
    probability rounds it by ~1e-6 relative), and a float64 uniform hits it with that probability; on float32's grid
    the set held one grid point, probability 2^-24 = 6e-8, 60x too often."""
    p = torch.tensor([[0.5, 1e-9, 0.5]], dtype=torch.float64)
    logits = p.log().float()
    width = token_interval(logits, 1)
    assert width == pytest.approx(1e-9 / (1 + 1e-9), rel=1e-5)
    assert token_interval(logits, 0) == pytest.approx(0.5, abs=1e-8)
    grid_points = math.ceil((0.5 + width) / GRID32) - math.ceil(0.5 / GRID32)  # what float32 uniforms could hit
    assert grid_points * GRID32 > 50 * width  # the old draw's probability: the 60x the issue measured


def aliasing_distribution(pairs: int) -> torch.Tensor:
    """Unnormalised float32 probabilities (all exact in float32, total 2^26) laid out so that float32 uniforms
    (u = k 2^-24, i.e. 4k in these units) hit only every other small token: 2^24 and 2^24 - 1 (one big mass of
    2^25 - 1), then 2 * pairs tokens of mass 2 each (2^-25 of the total), then the rest in two tokens. Small token
    2i + 1 spans [2^25 - 1 + 4i, 2^25 + 1 + 4i), which holds the grid point 2^25 + 4i; small token 2i + 2 spans
    [2^25 + 1 + 4i, 2^25 + 3 + 4i), which holds none."""
    rest = 2**25 + 1 - 4 * pairs
    p = [2.0**24, 2.0**24 - 1] + [2.0] * (2 * pairs) + [2.0**24, rest - 2.0**24]
    assert sum(p) == 2**26
    return torch.tensor(p, dtype=torch.float32)


def test_tokens_between_float32_grid_points_are_drawn_at_their_rate():
    """Chi-square over (big tokens, small tokens that hold a float32 grid point, small tokens that hold none) of
    tokens drawn with the decode loop's uniforms: each small token has probability 2^-25; float32 uniforms never
    drew the second kind (and drew the first kind twice as often). The draw is the first v with F(v) > u F(V) on one
    float64 cumulative sum, which inverse_cdf equals (checked here on the first 4096 draws, and in
    tests/test_fast_paths.py): one searchsorted per draw instead of a pass over the vocabulary keeps 2^21 draws fast."""
    pairs, draws, chunk = 2046, 1 << 21, 1 << 16
    p = aliasing_distribution(pairs)
    cdf = p.double().cumsum(0)
    gens = [torch.Generator().manual_seed(11 + i) for i in range(8)]
    hits = torch.zeros(3, dtype=torch.float64)
    for i in range(draws // chunk):
        u = uniforms(chunk, chunk // 8, gens)
        tok = torch.searchsorted(cdf, u * cdf[-1], right=True)
        if i == 0:
            assert torch.equal(inverse_cdf(p.expand(4096, -1), u[:4096])[0], tok[:4096])
        small = (tok >= 2) & (tok < 2 + 2 * pairs)
        on_grid = small & ((tok - 2) % 2 == 0)
        hits += torch.stack([(~small).sum(), on_grid.sum(), (small & ~on_grid).sum()]).double()
    expected = torch.tensor([1 - 2 * pairs * 2**-25, pairs * 2**-25, pairs * 2**-25], dtype=torch.float64) * draws
    chi2 = float(((hits - expected) ** 2 / expected).sum())
    assert expected[2] > 120 and hits[2] > 0, hits  # 128 expected: float32 uniforms hit none of them
    assert chi2 < 13.8, (chi2, hits.tolist(), expected.tolist())  # df 2, 0.1%


def test_non_finite_logits_raise_naming_the_row():
    logits = torch.zeros(4, 5)
    logits[1, 3] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match=r"row 1 of the batch has a NaN logit"):
        sample_tokens(logits, 1.0, torch.full((4,), 0.5, dtype=torch.float64))
    logits[1, 3], logits[2, 0] = float("inf"), float("inf")
    with pytest.raises(NonFiniteLogitsError, match=r"row 9 of the batch \(and 1 more row\) has a \+inf logit"):
        sample_tokens(logits, 1.0, torch.full((4,), 0.5, dtype=torch.float64), rows=torch.tensor([3, 9, 12, 13]))
    logits = torch.zeros(2, 5)
    logits[0] = float("-inf")
    with pytest.raises(NonFiniteLogitsError, match=r"row 0 of the batch has every logit -inf"):
        sample_tokens(logits, 1.0, None)  # greedy too
    assert issubclass(NonFiniteLogitsError, GrpolabError)  # the CLI prints it on one line
    logits[0] = -1e30  # very negative but finite: a distribution
    assert sample_tokens(logits, 1.0, torch.tensor([0.3, 0.3], dtype=torch.float64))[0].tolist() == [1, 1]


def test_a_model_with_nan_weights_stops_the_decode_loop(tiny_model_dir, one_thread):
    """A NaN weight (what a diverged update leaves) used to give every row token V-1 with a NaN logprob."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(NonFiniteLogitsError, match=r"row 0 of the batch \(and 3 more rows\) has a NaN logit"):
        decode_groups(model, ids, mask, 4, 3, 1.0, [0], 0, generators=[torch.Generator().manual_seed(0)])
