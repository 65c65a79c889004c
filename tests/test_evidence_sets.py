"""Evidence over a set of runs (grpolab.evaluation.sets): the hierarchical bootstrap on hand-computed cases, its two
limits (identical runs and one run: the ordinary paired bootstrap, exactly), its exact distribution on a tiny case,
and which runs form a set."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from grpolab.evaluation.sets import (aligned, paired_gains, recipe_groups, replicates, set_contrast, set_difference,
                                   set_evidence, set_mean, spread)
from grpolab.evaluation.scoring import bootstrap_ci, paired_bootstrap_diff


def test_identical_runs_reduce_to_the_ordinary_paired_bootstrap_exactly():
    d = np.random.default_rng(0).integers(-1, 2, 40).astype(float)  # per-problem gains in {-1, 0, 1}
    ordinary = bootstrap_ci(d)
    for runs in (1, 3):
        r = set_mean(np.tile(d, (runs, 1)))
        assert (r["mean"], r["ci_low"], r["ci_high"]) == pytest.approx(ordinary, abs=1e-12)
        assert r["spread"]["min"] == r["spread"]["max"]


def test_two_runs_that_disagree_completely_span_the_runs():
    """Run 1 solves all 3 problems, run 2 none: per replicate theta* = (draws of run 1) / 2, so 0, 1/2, 1 with
    probabilities 1/4, 1/2, 1/4 whatever problems are drawn; the 2.5% and 97.5% percentiles are 0 and 1. Pooling the
    runs per problem first (0.5 everywhere) would claim [0.5, 0.5]."""
    r = set_mean([[1, 1, 1], [0, 0, 0]])
    assert (r["mean"], r["ci_low"], r["ci_high"]) == (0.5, 0.0, 1.0)
    assert r["per_run"] == [1.0, 0.0] and r["spread"]["std"] == pytest.approx(np.sqrt(0.5))
    pooled = bootstrap_ci([0.5, 0.5, 0.5])
    assert pooled == (0.5, 0.5, 0.5)


def test_the_interval_widens_when_runs_disagree_and_not_when_they_agree():
    rng = np.random.default_rng(1)
    base = (rng.random(60) < 0.5).astype(float)
    agree = np.stack([base, base, base, base])
    shifted = np.stack([base, base, np.clip(base + (rng.random(60) < 0.5), 0, 1), np.clip(base - (rng.random(60) < 0.5), 0, 1)])
    a, b = set_mean(agree), set_mean(shifted)
    assert b["ci_high"] - b["ci_low"] > a["ci_high"] - a["ci_low"]


def test_replicate_distribution_matches_exact_enumeration():
    """R = 2 runs x P = 2 problems, x = [[1, 0], [0, 1]]: enumerate every (run draw, common problem draw), each of
    probability 1/16, and compare with 40000 bootstrap replicates. Drawing problems separately per run, or resampling
    only problems, gives another distribution."""
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    exact: Counter = Counter()
    for runs in itertools.product(range(2), repeat=2):
        for probs in itertools.product(range(2), repeat=2):
            exact[round(float(np.mean([x[a, j] for a in runs for j in probs])), 6)] += 1 / 16
    assert exact == {0.0: 2 / 16, 0.5: 12 / 16, 1.0: 2 / 16}
    reps = replicates([x], [1.0], n_boot=40000, seed=3)
    got = Counter(round(float(v), 6) for v in reps)
    for value, p in exact.items():
        assert got[value] / len(reps) == pytest.approx(p, abs=0.01), value
    assert set(got) == set(exact)


def test_set_difference_of_single_runs_is_the_paired_bootstrap():
    rng = np.random.default_rng(2)
    a, b = (rng.random(50) < 0.4).astype(float), (rng.random(50) < 0.6).astype(float)
    r = set_difference([a], [b])
    assert (r["mean"], r["ci_low"], r["ci_high"]) == pytest.approx(paired_bootstrap_diff(a, b), abs=1e-12)
    shift = set_difference([[0.2, 0.4, 0.6]], [[0.45, 0.65, 0.85]])  # +0.25 on every problem: no uncertainty
    assert (shift["mean"], shift["ci_low"], shift["ci_high"]) == pytest.approx((0.25, 0.25, 0.25))
    # two sets whose runs disagree: the difference of means carries both sets' run spread
    wide = set_difference([[1, 1, 1], [0, 0, 0]], [[1, 1, 1], [1, 1, 1]])
    assert wide["mean"] == 0.5 and wide["ci_low"] == 0.0 and wide["ci_high"] == 1.0


def test_alignment_and_bad_shapes():
    uids, d = paired_gains([({"p": 0, "q": 1, "r": 0}, {"q": 1, "p": 1}), ({"p": 0, "q": 1}, {"p": 0, "q": 0})])
    assert uids == ["p", "q"] and d.tolist() == [[1.0, 0.0], [0.0, -1.0]]
    with pytest.raises(ValueError, match="share no problem"):
        aligned([{"a": 1.0}, {"b": 1.0}])
    with pytest.raises(ValueError, match=r"\(runs >= 1, 3\)"):
        replicates([np.zeros((2, 3)), np.zeros((2, 4))], [1.0, -1.0])
    assert spread([0.5])["std"] is None


def row(name: str, scores: list[float]) -> dict:
    return {"model": name, "items": [{"uid": f"u{i}", "scores": {"accuracy": s}} for i, s in enumerate(scores)]}


def test_set_evidence_on_eval_rows_gains_are_paired_within_each_run():
    base = row("base", [0, 0, 1, 1])
    runs = [row("s0", [1, 0, 1, 1]), row("s1", [1, 1, 1, 1])]  # gains +1/4 and +2/4
    ev = set_evidence(runs, [base, base])["accuracy"]
    assert ev["gain"]["mean"] == pytest.approx(0.375) and ev["gain"]["per_run"] == [0.25, 0.5]
    assert ev["value"]["mean"] == pytest.approx(0.875)
    assert "gain" not in set_evidence(runs)["accuracy"]  # no reference rows: levels only
    assert set_evidence([runs[0], {"model": "x", "items": []}]) == {}
    contrast = set_contrast([runs[0]], [runs[1]])["accuracy"]
    assert contrast["mean"] == pytest.approx(0.25) and contrast["a"]["runs"] == contrast["b"]["runs"] == 1


def test_recipe_groups_allow_only_the_seed_and_git_to_differ():
    def manifest(seed: int, lr: float = 1e-5, commit: str = "a") -> dict:
        return {"config": {"train": {"seed": seed, "lr": lr}}, "git": {"commit": commit}}

    ms = [None, manifest(0), manifest(1, commit="b"), manifest(2, lr=1e-4), manifest(3, lr=1e-4), manifest(4)]
    assert recipe_groups(ms) == [[1, 2, 5], [3, 4]]
    assert recipe_groups([manifest(0), manifest(1, lr=2.0)]) == []
