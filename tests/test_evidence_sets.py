"""Evidence over a set of runs (grpolab.evaluation.sets): the two-stage t interval on hand-computed cases against a
float64 reference written out from its formula, its limits (identical runs and one run: the t interval over problems,
exactly), the refusal of runs on different problems unless aligned explicitly, and which runs form a set."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grpolab.errors import GrpolabError
from grpolab.evaluation.intervals import mean_interval, paired_interval, t_quantile
from grpolab.evaluation.sets import (
    aligned,
    check_same_evaluation,
    evaluation_differences,
    paired_gains,
    recipe_groups,
    set_contrast,
    set_difference,
    set_evidence,
    set_mean,
    spread,
    variance_terms,
)


def reference_interval(sets: list[np.ndarray], signs: list[float]) -> tuple[float, float, float]:
    """The module docstring's formula, written out loop by loop in float64 (no shared code with variance_terms)."""
    p = sets[0].shape[1]
    theta = sum(sg * sum(sum(row) for row in x) / (x.shape[0] * p) for x, sg in zip(sets, signs))
    d = [sum(sg * sum(x[r][i] for r in range(x.shape[0])) / x.shape[0] for x, sg in zip(sets, signs)) for i in range(p)]
    dbar = sum(d) / p
    s_d2 = sum((v - dbar) ** 2 for v in d) / (p - 1)
    within, between = 0.0, []  # sum_s w_s / R_s; (tau_s^2 / R_s, R_s - 1)
    for x in sets:
        r = x.shape[0]
        if r < 2:
            continue
        m = [sum(row) / p for row in x]
        mbar = sum(m) / r
        s_m2 = sum((v - mbar) ** 2 for v in m) / (r - 1)
        c = [sum(x[j][i] for j in range(r)) / r for i in range(p)]
        ms_e = sum((x[j][i] - m[j] - c[i] + mbar) ** 2 for j in range(r) for i in range(p)) / ((r - 1) * (p - 1))
        within += ms_e / p / r
        between.append((max(s_m2 - ms_e / p, 0.0) / r, r - 1))
    problem = max(s_d2 / p, within)
    half = math.sqrt(
        t_quantile(0.975, p - 1) ** 2 * problem + sum(t_quantile(0.975, df) ** 2 * v for v, df in between if v > 0)
    )
    return theta, max(theta - half, -1.0), min(theta + half, 1.0)


def test_interval_matches_the_formula_written_out():
    rng = np.random.default_rng(5)
    gains = (rng.random((3, 40)) < 0.5).astype(float) - (rng.random(40) < 0.4)[None, :]
    gains[2] += (rng.random(40) < 0.3) * (gains[2] < 1)  # a third seed that gains more: a between-seed part
    r = set_mean(gains)
    assert (r["mean"], r["ci_low"], r["ci_high"]) == pytest.approx(reference_interval([gains], [1.0]), abs=1e-12)
    assert r["runs"] == 3 and r["n"] == 40 and r["degenerate"] is None and "two-part t" in r["method"]
    _, parts = variance_terms([gains], [1.0])
    assert parts[1][0] > 0 and parts[1][1] == 2  # the seeds differ beyond their within-run noise
    # se and df reproduce the interval's ends: t_{0.975, df} se = half
    assert t_quantile(0.975, r["df"]) * r["se"] == pytest.approx(r["mean"] - r["ci_low"], rel=1e-9)
    a, b = (rng.random((2, 40)) < 0.4).astype(float), (rng.random((4, 40)) < 0.6).astype(float)
    d = set_difference(a, b)
    assert (d["mean"], d["ci_low"], d["ci_high"]) == pytest.approx(reference_interval([a, b], [-1.0, 1.0]), abs=1e-12)
    assert d["a"]["runs"] == 2 and d["b"]["runs"] == 4 and d["n"] == 40


def test_hand_computed_two_runs_by_three_problems():
    """x = [[1, 0, 1], [1, 1, 1]]: run means 2/3 and 1, problem means 1, 1/2, 1. S_d^2 / P = 1/12 / 3 = 1/36; MS_E =
    1/6, so the within-run component is w = MS_E / P = 1/18 = S_m^2: no between-seed part, and the problem part is
    max(1/36, w / R = 1/36) = 1/36 with P - 1 = 2 df (the old two-stage V counted the within-run noise twice: 1/18)."""
    r = set_mean([[1, 0, 1], [1, 1, 1]], bounds=(0.0, 1.0))
    half = 4.302652729749464 * math.sqrt(1 / 36)
    assert r["mean"] == pytest.approx(5 / 6) and r["df"] == pytest.approx(2.0) and r["se"] == pytest.approx(1 / 6)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((5 / 6 - half, 1.0), abs=1e-9)  # clipped to the score's 1


def test_identical_runs_and_one_run_reduce_to_the_t_interval_over_problems():
    d = np.random.default_rng(0).integers(-1, 2, 40).astype(float)  # per-problem gains in {-1, 0, 1}
    ordinary = mean_interval(d)
    for runs in (1, 3):
        r = set_mean(np.tile(d, (runs, 1)))
        assert (r["mean"], r["ci_low"], r["ci_high"]) == pytest.approx(
            (ordinary["mean"], ordinary["ci_low"], ordinary["ci_high"]), abs=1e-12
        )
        assert r["spread"]["min"] == r["spread"]["max"] and r["df"] == pytest.approx(39)


def test_runs_that_disagree_completely_get_the_t_over_run_means():
    """Run 1 solves all 3 problems, run 2 none: every problem's mean over runs is 0.5 (S_d = 0) and MS_E = 0, so the
    whole uncertainty is between runs: tau^2 = S_m^2 = 0.5, over R = 2: se 0.5, one df, 0.5 -/+ 12.706 * 0.5, clipped
    to the score's [0, 1]. Pooling the runs per problem first would claim [0.5, 0.5]."""
    r = set_mean([[1, 1, 1], [0, 0, 0]], bounds=(0.0, 1.0))
    assert (
        r["per_run"] == [1.0, 0.0]
        and r["spread"]["std"] == pytest.approx(np.sqrt(0.5))
        and r["df"] == pytest.approx(1.0)
        and r["se"] == pytest.approx(0.5)
    )
    assert (r["ci_low"], r["ci_high"]) == (0.0, 1.0)


def test_within_run_noise_floors_the_interval_when_problem_means_agree():
    """[[1, 0], [0, 1]]: both problem means 0.5 (S_d = 0) and both run means 0.5 (S_m = 0), yet each run got a
    different problem right: MS_E = 1, w = 1/2 per run, w / R = 1/4 is the problem part (the old V was 0: a point)."""
    r = set_mean([[1, 0], [0, 1]])
    assert r["se"] == pytest.approx(0.5) and r["df"] == pytest.approx(1.0) and r["degenerate"] is None
    assert (r["ci_low"], r["ci_high"]) == (-1.0, 1.0)


def test_the_interval_widens_when_runs_disagree_and_not_when_they_agree():
    rng = np.random.default_rng(1)
    base = (rng.random(60) < 0.5).astype(float)
    agree = np.stack([base, base, base, base])
    shifted = np.stack(
        [base, base, np.clip(base + (rng.random(60) < 0.5), 0, 1), np.clip(base - (rng.random(60) < 0.5), 0, 1)]
    )
    a, b = set_mean(agree), set_mean(shifted)
    assert b["ci_high"] - b["ci_low"] > a["ci_high"] - a["ci_low"]


def test_set_difference_of_single_runs_is_the_paired_t_interval():
    rng = np.random.default_rng(2)
    a, b = (rng.random(50) < 0.4).astype(float), (rng.random(50) < 0.6).astype(float)
    r, ref = set_difference([a], [b]), paired_interval(a, b)
    assert (r["mean"], r["ci_low"], r["ci_high"]) == pytest.approx(
        (ref["mean"], ref["ci_low"], ref["ci_high"]), abs=1e-12
    )
    shift = set_difference([[0.2, 0.4, 0.6]], [[0.45, 0.65, 0.85]])  # +0.25 on every problem: no spread at all
    assert (shift["mean"], shift["ci_low"], shift["ci_high"]) == pytest.approx((0.25, 0.25, 0.25))
    assert shift["degenerate"] == "all equal"
    # two sets whose runs disagree: the difference of means carries the run spread (t with 1 df)
    wide = set_difference([[1, 1, 1], [0, 0, 0]], [[1, 1, 1], [1, 1, 1]])
    assert wide["mean"] == 0.5 and wide["se"] == pytest.approx(0.5) and wide["df"] == pytest.approx(1.0)
    assert (wide["ci_low"], wide["ci_high"]) == (-1.0, 1.0)  # 0.5 -/+ 6.35, clipped to a difference's [-1, 1]


def test_degenerate_sets_are_named_and_equal_right_wrong_numbers_get_the_exact_interval():
    assert set_mean([[1.0], [0.0], [1.0]])["degenerate"] == "one problem"
    assert set_mean([[0.5, 0.5], [0.5, 0.5]])["degenerate"] == "all equal"  # graded numbers: a point
    theta, parts = variance_terms([np.array([[1.0, 1.0], [1.0, 1.0]])], [1.0])
    assert (theta, parts) == (1.0, [(0.0, 1), (0.0, 1)])
    # every run unchanged on all 50 problems: not a zero-width claim but 0 of 50 changes, [-q, q], q = 1 - 0.025^(1/50)
    q = 1 - 0.025 ** (1 / 50)
    none = set_mean(np.zeros((3, 50)))
    assert none["degenerate"] is None and (none["ci_low"], none["ci_high"]) == pytest.approx((-q, q), abs=1e-12)
    assert round(q, 4) == 0.0711
    gained = set_mean(np.ones((3, 50)))  # every problem wrong -> right in every run
    assert (gained["ci_low"], gained["ci_high"]) == pytest.approx((1 - 2 * q, 1.0), abs=1e-12)
    solved = set_mean(np.ones((3, 50)), bounds=(0.0, 1.0))  # a score of 1 on every problem: Clopper-Pearson
    assert (solved["ci_low"], solved["ci_high"]) == pytest.approx((1 - q, 1.0), abs=1e-12)


def test_alignment_is_exact_unless_told_to_intersect():
    """A run of 200 problems and a run of 3 used to become n = 3 silently; now refused, naming both runs."""
    big = {f"u{i}": 1.0 for i in range(200)}
    small = {"u0": 1.0, "u1": 1.0, "u2": 1.0}
    with pytest.raises(
        GrpolabError, match=r"seed0 \(200 problems\) and seed1 \(3 problems\).*3 shared.*align='intersect'"
    ):
        aligned([big, small], ["seed0", "seed1"])
    uids, x = aligned([big, small], ["seed0", "seed1"], align="intersect")
    assert uids == ["u0", "u1", "u2"] and x.shape == (2, 3)
    with pytest.raises(GrpolabError, match="share no problem"):
        aligned([{"a": 1.0}, {"b": 1.0}], align="intersect")
    with pytest.raises(GrpolabError, match="share no problem"):
        aligned([{"a": 1.0}, {"b": 1.0}])
    with pytest.raises(ValueError, match="align='both'"):
        aligned([big], align="both")
    with pytest.raises(GrpolabError, match=r"run 1: the model and its reference were evaluated on different problems"):
        paired_gains([({"p": 0, "q": 1, "r": 0}, {"q": 1, "p": 1}), ({"p": 0, "q": 1}, {"p": 0, "q": 0})])
    uids, d = paired_gains(
        [({"p": 0, "q": 1, "r": 0}, {"q": 1, "p": 1}), ({"p": 0, "q": 1}, {"p": 0, "q": 0})], align="intersect"
    )
    assert uids == ["p", "q"] and d.tolist() == [[1.0, 0.0], [0.0, -1.0]]
    with pytest.raises(ValueError, match=r"\(runs >= 1, problems >= 1\)"):
        set_difference(np.zeros((2, 3)), np.zeros((2, 4)))
    assert spread([0.5])["std"] is None


def test_evaluations_that_differ_are_named():
    a = {
        "task": "math500",
        "split": "test",
        "data_hash": "h1",
        "decoding": {"max_new_tokens": 512, "seed": 0, "samples": 0},
    }
    b = {**a, "decoding": {"max_new_tokens": 256, "seed": 3, "samples": 0}}
    assert evaluation_differences(a, b) == [("decoding.max_new_tokens", 512, 256)]
    assert (
        evaluation_differences(a, {**a, "decoding": {**a["decoding"], "seed": 9}}) == []
    )  # the sampling seed may differ
    check_same_evaluation(["s0", "s1"], [a, dict(a)])
    with pytest.raises(GrpolabError, match=r"s0 and s1 were not evaluated the same way \(data_hash: 'h1' vs 'h2'"):
        check_same_evaluation(["s0", "s1"], [a, {**a, "data_hash": "h2"}])


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
    short = row("s2", [1, 1])  # answered 2 of the 4 problems
    with pytest.raises(GrpolabError, match=r"s0 \(4 problems\) and s2 \(2 problems\)"):
        set_evidence([runs[0], short], [base, base])
    assert set_evidence([runs[0], short], [base, base], align="intersect")["accuracy"]["gain"]["n"] == 2


def test_recipe_groups_allow_only_the_seed_and_git_to_differ():
    def manifest(seed: int, lr: float = 1e-5, commit: str = "a") -> dict:
        return {"config": {"train": {"seed": seed, "lr": lr}}, "git": {"commit": commit}}

    ms = [None, manifest(0), manifest(1, commit="b"), manifest(2, lr=1e-4), manifest(3, lr=1e-4), manifest(4)]
    assert recipe_groups(ms) == [[1, 2, 5], [3, 4]]
    assert recipe_groups([manifest(0), manifest(1, lr=2.0)]) == []
