"""The coverage simulation of benchmarks/interval_coverage.py: its truths are exact, and a few of its cases are pinned
at a modest number of simulations with a fixed seed -- the seed-set interval holds its coverage where the old
two-stage percentile bootstrap did not, and pass@k from more samples than k is covered where the percentile
bootstrap was not."""

from __future__ import annotations

import importlib.util
import math
from itertools import product
from pathlib import Path

import numpy as np
import pytest

from grpolab.evaluation.intervals import (
    MIN_PROBLEMS,
    degeneracy,
    evidence_reason,
    mean_interval,
    paired_evidence_interval,
    paired_score_interval,
    score_interval,
    studentized_bootstrap_interval,
    t_quantile,
    too_little_evidence,
)

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "interval_coverage.py"
SIMS = 1000


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("grpolab_bench_interval_coverage", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_truths_are_exact(sim):
    assert sim.true_gain(0.0) == pytest.approx(0.6 * 0.25 - 0.4 * 0.25, abs=1e-15)
    # E[max(0, m + u)] by a fine Riemann sum over the normal density
    u = np.linspace(-1, 1, 400001)
    dens = np.exp(-(u**2) / (2 * 0.08**2)) / (0.08 * math.sqrt(2 * math.pi))
    assert sim._expected_positive_part(0.25, 0.08) == pytest.approx(
        float(np.sum(np.maximum(0, 0.25 + u) * dens) * (u[1] - u[0])), abs=1e-9
    )
    # pass@4 truth against the definition: P(any of 4 independent samples correct), averaged over the population
    direct = sum(w * (1 - math.prod(1 - p for _ in range(4))) for p, w in zip(sim.PASS_RATES, sim.PASS_WEIGHTS))
    assert sim.true_pass_at_k(4) == pytest.approx(direct, abs=1e-12)
    # the simulated populations have the stated means (many problems, fixed seed)
    rng = np.random.default_rng(0)
    base, (trained,) = sim.draw_runs(rng, 400, 2000, 0.08)
    assert float((trained - base).mean()) == pytest.approx(sim.true_gain(0.08), abs=0.01)
    assert float(sim.draw_pass_at_k(rng, 4000, 16, 4).mean()) == pytest.approx(sim.true_pass_at_k(4), abs=0.015)


def test_seed_set_interval_holds_coverage_where_the_old_bootstrap_did_not(sim):
    """3 seeds, between-seed SD 0.08, 200 problems (the review: 0.85 coverage, 8.2% wholly above the truth)."""
    new = sim.coverage(*sim.seed_set_case(3, 0.08, "two-part t"), sims=SIMS, seed=0)
    old = sim.coverage(*sim.seed_set_case(3, 0.08, "old two-stage bootstrap", n_boot=400), sims=SIMS, seed=0)
    assert new["coverage"] >= 0.925 and new["above"] <= 0.04 and new["below"] <= 0.04, new
    assert old["coverage"] < 0.90, old
    # when the seeds agree the interval stays about as wide as the old one (which over-covered there)
    agree_new = sim.coverage(*sim.seed_set_case(3, 0.0, "two-part t"), sims=300, seed=1)
    agree_old = sim.coverage(*sim.seed_set_case(3, 0.0, "old two-stage bootstrap", n_boot=400), sims=300, seed=1)
    assert agree_new["coverage"] >= 0.95 and agree_new["width"] <= 1.15 * agree_old["width"], (agree_new, agree_old)


def test_pass_at_k_from_more_samples_is_covered(sim):
    """pass@4 from 16 samples, trained - base, 30 problems: percentile bootstrap and t miss low on the skewed
    differences; the studentised bootstrap the evaluation now uses does not."""
    stud = sim.coverage(*sim.pass_at_k_case(30, 16, 4, True, "studentised bootstrap", n_boot=400), sims=SIMS, seed=0)
    perc = sim.coverage(*sim.pass_at_k_case(30, 16, 4, True, "percentile bootstrap", n_boot=400), sims=SIMS, seed=0)
    assert stud["coverage"] >= 0.93 and stud["below"] <= 0.04, stud
    assert perc["coverage"] < 0.925 and perc["below"] > 0.05, perc


def test_t_quantiles_match_tables():
    table = {
        (0.975, 1): 12.706204736,
        (0.975, 2): 4.302652730,
        (0.975, 5): 2.570581836,
        (0.975, 30): 2.042272456,
        (0.95, 10): 1.812461123,
        (0.995, 3): 5.840909310,
    }
    for (p, df), q in table.items():
        assert t_quantile(p, df) == pytest.approx(q, abs=1e-8)
        assert t_quantile(1 - p, df) == pytest.approx(-q, abs=1e-8)
    # non-integer df (Satterthwaite): the density integrated numerically from 0 to the quantile gives 0.475
    df, q = 2.5, t_quantile(0.975, 2.5)
    x = np.linspace(0.0, q, 2_000_001)
    density = (
        math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2))
        / math.sqrt(df * math.pi)
        * (1 + x * x / df) ** (-(df + 1) / 2)
    )
    assert 0.5 + float(np.trapezoid(density, x)) == pytest.approx(0.975, abs=1e-10)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError, match="df > 0"):
        t_quantile(0.975, 0)


def test_mean_interval_hand_computed_and_degenerate_cases():
    r = mean_interval([1, 0, 1, 1, 0])
    half = 2.776445105 * math.sqrt(0.3 / 5)  # t_{.975,4}, s^2 = 0.3
    assert (r["mean"], r["ci_low"], r["ci_high"]) == pytest.approx((0.6, 0.6 - half, 0.6 + half), abs=1e-8)
    assert r["n"] == 5 and r["degenerate"] is None and r["method"] == "t over problems"
    assert mean_interval([1.0])["degenerate"] == "one problem"
    flat = mean_interval([0.0] * 40)
    assert (flat["ci_low"], flat["ci_high"], flat["degenerate"]) == (0.0, 0.0, "all equal")
    assert degeneracy([]) == "no values"
    with pytest.raises(ValueError, match="no values"):
        mean_interval([])


def test_score_interval_picks_t_for_binary_and_bootstrap_t_for_graded():
    assert score_interval([0, 1, 1, 0])["method"] == "t over problems"
    graded = score_interval([0.0, 0.5, 1.0, 0.25, 0.75, 0.0, 1.0])
    assert (
        graded["method"] == "studentised bootstrap over problems" and 0.0 <= graded["ci_low"] < graded["ci_high"] <= 1.0
    )
    assert paired_score_interval([0, 1, 0], [1, 1, 0])["method"] == "t over problems"
    assert paired_score_interval([0.2, 0.5, 0.0], [0.3, 0.5, 0.25])["paired"] is True


def test_studentized_bootstrap_against_a_direct_computation():
    """Order statistics of t*_b = (m*_b - m) / se*_b over the same draws, computed one resample at a time."""
    from grpolab.evaluation.scoring import bootstrap_indices

    v = np.array([0.0, 0.25, 0.5, 1.0, 1.0, 0.75, 0.0, 0.5, 0.125, 0.875])
    r = studentized_bootstrap_interval(v, n_boot=400, seed=3)
    m, se = v.mean(), v.std(ddof=1) / math.sqrt(v.size)
    ts = []
    for idx in np.concatenate(list(bootstrap_indices(v.size, 400, 3))):
        x = v[idx]
        s = x.std(ddof=1) / math.sqrt(v.size)
        ts.append((x.mean() - m) / s if s > 0 else math.copysign(math.inf, x.mean() - m) if x.mean() != m else 0.0)
    ts.sort()
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((m - ts[389] * se, m - ts[10] * se), abs=1e-12)


def test_minimum_evidence():
    assert MIN_PROBLEMS == 30
    assert too_little_evidence(29) == "too little evidence: 29 problems < 30" and too_little_evidence(30) is None
    assert too_little_evidence(3, 10, "prompts") == "too little evidence: 3 prompts < 10"
    assert evidence_reason({"n": 1, "degenerate": "one problem"}) == "degenerate: one problem"
    assert evidence_reason({"n": 300, "degenerate": None}) is None
    assert evidence_reason({}) == "too little evidence: 0 problems < 30"
    for a, b in product([0.0, 1.0], repeat=2):  # all-wrong / all-wrong capability evals and the like
        assert evidence_reason(paired_score_interval([a] * 50, [b] * 50)) == "degenerate: all equal"
        # the report's paired comparisons: the exact interval of 50 equal changes (equal_changes_interval)
        r = paired_evidence_interval([a] * 50, [b] * 50)
        q = 1 - 0.025 ** (1 / 50)
        expected = {0.0: (-q, q), 1.0: (1 - 2 * q, 1.0), -1.0: (-1.0, -1 + 2 * q)}[b - a]
        assert (r["ci_low"], r["ci_high"]) == pytest.approx(expected, abs=1e-12) and evidence_reason(r) is None
    assert paired_evidence_interval([0.5] * 50, [0.5] * 50)["degenerate"] == "all equal"  # graded: still a point


def test_binary_intervals_stay_where_the_metric_lives():
    """A t interval over 3 problems reaches past [0, 1] (0.667 +- 1.43): the accuracy interval is clipped to [0, 1],
    a paired difference to [-1, 1]; the mean and n are untouched."""
    r = score_interval([1.0, 1.0, 0.0])
    assert (r["ci_low"], r["ci_high"]) == (0.0, 1.0) and r["mean"] == pytest.approx(2 / 3) and r["n"] == 3
    d = paired_score_interval([0.0, 0.0, 1.0], [1.0, 1.0, 0.0])
    assert d["ci_low"] == -1.0 and d["ci_high"] == 1.0 and d["mean"] == pytest.approx(1 / 3)
    wide = mean_interval([1.0, 1.0, 0.0])
    assert wide["ci_low"] < 0.0 < 1.0 < wide["ci_high"]  # the unclipped t interval does reach past
