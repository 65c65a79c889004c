"""Coverage of the intervals the release gate uses, by simulation with known truths (numpy only, machine-independent).

Every case draws evaluations from a population whose true value is known exactly, builds the interval grpolab builds,
and counts how often it holds the truth (coverage, nominal 0.95) and how often it lies wholly above the truth (a
claimed gain that is too large: ``above``) or wholly below it (``below``), nominal 0.025 each.

Populations (all numbers per problem; a problem is drawn from the population, then each run's answers):

- held-out gain of one run (paired, binary): the base answers a problem correctly with probability 0.4; a run of the
  recipe with seed effect u ~ N(0, sd^2) learns a problem the base missed with probability (0.25 + u) h and forgets
  one it solved with probability (0.25 - u) h (each clipped at 0), h ~ U(0.5, 1.5) per problem. True gain (over
  problems and seeds) 0.6 E[max(0, 0.25 + u)] - 0.4 E[max(0, 0.25 - u)] (= 0.05 for sd = 0). The between-seed SD of
  the per-seed gains is sd.
- set of R seeds: R runs of that recipe on the same P problems (gains d_{r,i} = trained_r - base).
- two sets: recipe A as above, recipe B learning with 0.30 + u and forgetting with 0.20 - u, R runs each on the same
  problems; the truth is the difference of their true accuracies.
- pass@k with n samples > k: a problem's solve rate p is one of PASS_RATES (weights PASS_WEIGHTS); the trained
  model's is p^0.6 (sharper); each model draws n samples per problem, c correct, and pass@k is the unbiased
  1 - C(n - c, k) / C(n, k). Truth: sum_p w_p (1 - (1 - p)^k), exactly.

Intervals: "t" = grpolab.evaluation.intervals.mean_interval / paired_interval (what grpolab eval uses for binary
per-problem scores and their paired differences); "studentised bootstrap" = intervals.score_interval /
paired_score_interval on graded scores (what grpolab eval uses for pass@k with more samples than k); "percentile
bootstrap" = grpolab.evaluation.scoring.bootstrap_ci / paired_bootstrap_diff (the interval used before, for
comparison); "two-part t" = grpolab.evaluation.sets.set_mean / set_difference (sets of runs); "old two-stage
bootstrap" = the hierarchical percentile bootstrap sets.py used before (runs drawn with replacement, one common problem
draw per replicate), kept here for comparison.

    python benchmarks/interval_coverage.py                 # default: a few minutes on one core
    python benchmarks/interval_coverage.py --sims 10000    # tighter estimates (standard error ~ 0.002)

The table it prints is in docs/evaluation.md ("Coverage of the intervals").
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpolab.evaluation.intervals import mean_interval, paired_interval, paired_score_interval, score_interval  # noqa: E402
from grpolab.evaluation.scoring import bootstrap_ci, paired_bootstrap_diff, pass_at_k  # noqa: E402
from grpolab.evaluation.sets import set_difference, set_mean  # noqa: E402

BASE_ACCURACY = 0.4
RECIPE_A = (0.25, 0.25)  # (learn, forget) rates before the per-problem factor h
RECIPE_B = (0.30, 0.20)
PASS_RATES = np.array([0.0, 0.02, 0.1, 0.3, 0.6, 0.9, 1.0])
PASS_WEIGHTS = np.array([0.25, 0.10, 0.15, 0.15, 0.10, 0.10, 0.15])
SHARPEN = 0.6

Interval = Callable[..., tuple[float, float]]
OLD_INTERVALS = ("percentile bootstrap", "old two-stage bootstrap")  # used before; simulated for comparison


# ---------------------------------------------------------------- populations with known truths


def _expected_positive_part(m: float, sd: float) -> float:
    """E[max(0, m + u)] for u ~ N(0, sd^2): m Phi(m/sd) + sd phi(m/sd) (m itself for sd = 0, m >= 0)."""
    if sd == 0:
        return max(m, 0.0)
    z = m / sd
    return m * 0.5 * (1 + math.erf(z / math.sqrt(2))) + sd * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def true_accuracy(recipe: tuple[float, float], sd: float) -> float:
    """Population accuracy of a recipe: base + (1 - base) E[learn] - base E[forget] (E[h] = 1)."""
    learn, forget = recipe
    return (
        BASE_ACCURACY
        + (1 - BASE_ACCURACY) * _expected_positive_part(learn, sd)
        - BASE_ACCURACY * _expected_positive_part(forget, sd)
    )


def true_gain(sd: float, recipe: tuple[float, float] = RECIPE_A) -> float:
    """Population gain of a recipe over the base."""
    return true_accuracy(recipe, sd) - BASE_ACCURACY


def draw_runs(
    rng: np.random.Generator,
    runs: int,
    problems: int,
    sd: float,
    recipes: tuple[tuple[float, float], ...] = (RECIPE_A,),
) -> tuple[np.ndarray, list[np.ndarray]]:
    """(base correctness (P,), [trained correctness (runs, P) per recipe]) on one draw of P problems."""
    base = rng.random(problems) < BASE_ACCURACY
    h = rng.uniform(0.5, 1.5, problems)
    out = []
    for learn, forget in recipes:
        u = rng.normal(0.0, sd, runs) if sd > 0 else np.zeros(runs)
        p_learn = np.clip(learn + u, 0, None)[:, None] * h[None, :]
        p_keep = 1 - np.clip(forget - u, 0, None)[:, None] * h[None, :]
        p = np.where(base[None, :], p_keep, p_learn)
        out.append((rng.random((runs, problems)) < np.clip(p, 0, 1)).astype(float))
    return base.astype(float), out


def true_pass_at_k(k: int, sharpen: float = 1.0) -> float:
    """sum_p w_p (1 - (1 - p^sharpen)^k) over the problem population."""
    return float(PASS_WEIGHTS @ (1 - (1 - PASS_RATES**sharpen) ** k))


def draw_pass_at_k(rng: np.random.Generator, problems: int, samples: int, k: int, sharpen: float = 1.0) -> np.ndarray:
    """Per-problem unbiased pass@k of P problems drawn from the population, `samples` samples each."""
    rates = rng.choice(PASS_RATES, size=problems, p=PASS_WEIGHTS) ** sharpen
    correct = rng.binomial(samples, rates)
    return np.array([pass_at_k(samples, int(c), k) for c in correct])


def draw_pass_at_k_pair(rng: np.random.Generator, problems: int, samples: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(base, trained) per-problem pass@k on the same problems; the trained model's rate is p^SHARPEN."""
    rates = rng.choice(PASS_RATES, size=problems, p=PASS_WEIGHTS)
    out = []
    for r in (rates, rates**SHARPEN):
        out.append(np.array([pass_at_k(samples, int(c), k) for c in rng.binomial(samples, r)]))
    return out[0], out[1]


# ---------------------------------------------------------------- the old interval, for comparison


def old_two_stage_bootstrap(
    sets: list[np.ndarray], signs: list[float], n_boot: int = 1000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float]:
    """The hierarchical percentile bootstrap grpolab used before: per replicate, R_s runs drawn with replacement in
    each set and one common draw of P problems; the alpha/2 and 1 - alpha/2 quantiles of sum_s sign_s theta*_s."""
    rng = np.random.default_rng(seed)
    p = sets[0].shape[1]
    probs = rng.integers(0, p, (n_boot, p))
    total = np.zeros(n_boot)
    for x, sign in zip(sets, signs):
        drawn = rng.integers(0, x.shape[0], (n_boot, x.shape[0]))
        per_problem = x[drawn].mean(axis=1)  # (n_boot, P): mean of the drawn runs
        total += sign * np.take_along_axis(per_problem, probs, axis=1).mean(axis=1)
    lo, hi = np.quantile(total, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


# ---------------------------------------------------------------- coverage


def coverage(
    draw: Callable[[np.random.Generator], tuple], interval: Interval, truth: float, sims: int, seed: int = 0
) -> dict[str, float]:
    """Run `sims` simulations: data = draw(rng), (lo, hi) = interval(*data, sim index); the share of intervals that
    hold `truth`, lie wholly above it, wholly below it, and their mean width."""
    rng = np.random.default_rng(seed)
    hold = above = below = 0
    width = 0.0
    for s in range(sims):
        lo, hi = interval(*draw(rng), s)
        hold += lo <= truth <= hi
        above += lo > truth
        below += hi < truth
        width += hi - lo
    return {"coverage": hold / sims, "above": above / sims, "below": below / sims, "width": width / sims, "sims": sims}


def heldout_gain_case(problems: int, method: str, n_boot: int = 1000) -> tuple[Callable, Interval, float]:
    """One run's paired held-out gain on `problems` problems; method "t" or "percentile bootstrap"."""

    def draw(rng):
        base, (trained,) = draw_runs(rng, 1, problems, 0.0)
        return base, trained[0]

    def t(base, trained, s):
        r = paired_interval(base, trained)
        return r["ci_low"], r["ci_high"]

    def boot(base, trained, s):
        return paired_bootstrap_diff(base, trained, n_boot=n_boot, seed=s)[1:]

    return draw, {"t": t, "percentile bootstrap": boot}[method], true_gain(0.0)


def seed_set_case(
    runs: int, sd: float, method: str, problems: int = 200, n_boot: int = 1000
) -> tuple[Callable, Interval, float]:
    """A set of `runs` seeds' paired gains on the same problems; method "two-part t" or "old two-stage bootstrap"."""

    def draw(rng):
        base, (trained,) = draw_runs(rng, runs, problems, sd)
        return (trained - base[None, :],)

    def new(gains, s):
        r = set_mean(gains)
        return r["ci_low"], r["ci_high"]

    def old(gains, s):
        return old_two_stage_bootstrap([gains], [1.0], n_boot, s)

    return draw, {"two-part t": new, "old two-stage bootstrap": old}[method], true_gain(sd)


def two_set_case(
    runs: int, sd: float, method: str, problems: int = 200, n_boot: int = 1000
) -> tuple[Callable, Interval, float]:
    """Recipe B - recipe A, `runs` seeds each, accuracies on the same problems."""

    def draw(rng):
        _, (a, b) = draw_runs(rng, runs, problems, sd, (RECIPE_A, RECIPE_B))
        return a, b

    def new(a, b, s):
        r = set_difference(a, b)
        return r["ci_low"], r["ci_high"]

    def old(a, b, s):
        return old_two_stage_bootstrap([a, b], [-1.0, 1.0], n_boot, s)

    return (
        draw,
        {"two-part t": new, "old two-stage bootstrap": old}[method],
        true_accuracy(RECIPE_B, sd) - true_accuracy(RECIPE_A, sd),
    )


def pass_at_k_case(
    problems: int, samples: int, k: int, paired: bool, method: str, n_boot: int = 1000
) -> tuple[Callable, Interval, float]:
    """pass@k with `samples` > k samples per problem: one model's level, or trained - base (paired)."""
    if paired:

        def draw(rng):
            return draw_pass_at_k_pair(rng, problems, samples, k)

        def t(b, tr, s):
            r = paired_interval(b, tr)
            return r["ci_low"], r["ci_high"]

        def boot(b, tr, s):
            return paired_bootstrap_diff(b, tr, n_boot=n_boot, seed=s)[1:]

        def student(b, tr, s):
            r = paired_score_interval(b, tr, n_boot=n_boot, seed=s)
            return r["ci_low"], r["ci_high"]

        truth = true_pass_at_k(k, SHARPEN) - true_pass_at_k(k)
    else:

        def draw(rng):
            return (draw_pass_at_k(rng, problems, samples, k),)

        def t(v, s):
            r = mean_interval(v)
            return r["ci_low"], r["ci_high"]

        def boot(v, s):
            return bootstrap_ci(v, n_boot=n_boot, seed=s)[1:]

        def student(v, s):
            r = score_interval(v, n_boot=n_boot, seed=s)
            return r["ci_low"], r["ci_high"]

        truth = true_pass_at_k(k)
    return draw, {"t": t, "percentile bootstrap": boot, "studentised bootstrap": student}[method], truth


def table(sims: int, boot_sims: int, n_boot: int, seed: int = 0) -> list[tuple[str, str, dict[str, float]]]:
    """(case, method, coverage dict) for every interval the gate uses; the intervals kept for comparison (the
    percentile bootstraps used before) get boot_sims simulations, grpolab's own get sims."""
    rows = []

    def add(case: str, method: str, built: tuple) -> None:
        n = boot_sims if method in OLD_INTERVALS else sims
        rows.append((case, method, coverage(*built, sims=n, seed=seed)))
        print(
            f"| {case} | {method} | "
            + " | ".join(f"{rows[-1][2][k]:.3f}" for k in ("coverage", "above", "below", "width"))
            + f" | {n} |",
            flush=True,
        )

    for p in (50, 200, 300):
        for m in ("t", "percentile bootstrap"):
            add(f"one run, held-out gain, n = {p}", m, heldout_gain_case(p, m, n_boot))
    for runs in (2, 3, 5):  # 2 seeds under-cover: the gate needs MIN_RUNS = 3 for a PASS
        for sd in (0.0, 0.04, 0.08):
            for m in ("two-part t", "old two-stage bootstrap"):
                add(f"{runs} seeds, between-seed SD {sd:.2f}, n = 200", m, seed_set_case(runs, sd, m, 200, n_boot))
    for sd in (0.0, 0.08):
        for m in ("two-part t", "old two-stage bootstrap"):
            add(f"two sets of 3 seeds, B - A, SD {sd:.2f}, n = 200", m, two_set_case(3, sd, m, 200, n_boot))
    for p in (30, 64):
        for paired in (False, True):
            for m in ("studentised bootstrap", "t", "percentile bootstrap"):
                what = "trained - base" if paired else "one model"
                add(f"pass@4 of 16 samples, {what}, n = {p}", m, pass_at_k_case(p, 16, 4, paired, m, n_boot))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000, help="simulations per case for the t intervals")
    ap.add_argument(
        "--boot-sims",
        type=int,
        default=500,
        help="simulations per case for the intervals used before (percentile bootstraps), kept for comparison",
    )
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples per interval")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("| case | interval | coverage | wholly above truth | wholly below truth | mean width | simulations |")
    print("|---|---|---|---|---|---|---|")
    table(args.sims, args.boot_sims, args.n_boot, args.seed)


if __name__ == "__main__":
    main()
