"""Coverage of the seed-set interval (grpolab.evaluation.sets.set_mean) by simulation with known truths: several
seeds of one recipe, each run's paired held-out gain on the same 266 problems against one base evaluation.

Population. Problem i has a base solve rate q_i ~ Beta(2 p0, 2 (1 - p0)) (mean p0); the base answers it right with
probability q_i (one draw, shared by every run). Seed r of the recipe has gain g_r = clip(gain + u_r - loss B_r,
-p0, 1 - p0), u_r ~ N(0, sd^2) (the between-seed SD) and B_r ~ Bernoulli(fail) (a failing seed: the outlier mixture),
and answers problem i right with probability q_i + g_r (1 - q_i) / (1 - p0) for g_r >= 0, q_i (1 + g_r / p0) below 0,
so its expected gain over problems is exactly g_r. The truth is the recipe's mean gain E[g_r] over problems and seeds
(exact: the normal's clipped mean in closed form). Cases: base accuracy p0 0.3 with a true gain of +0.10 and p0 0.5
with +0.05; between-seed SD 0, 0.04, 0.08, 0.12; the mixture "one seed in five losing 0.15" (fail 0.2, loss 0.15) at
SD 0 and 0.04; 3 and 5 seeds.

Intervals on the same simulated sets: "two-part t" = grpolab's set_mean (what the release gate uses);
"ANOVA" = the one-way ANOVA estimate of Var(theta) truncated at a between-seed variance of 0 with Satterthwaite's df
(S_d^2/P - w/R with P - 1 df, S_m^2/R with R - 1 df; w = MS_E/P); "old" = the two-stage interval grpolab used before
(V = S_d^2/P + S_m^2/R, Satterthwaite df of the unbiased combination). "one run" is the paired t interval's width of
a single run. Nominal: coverage 0.95, 0.025 wholly above the truth (a gain claimed too large), 0.025 wholly below.

    python benchmarks/seed_set_coverage.py                 # 4000 sets per case, about a minute on one core
    python benchmarks/seed_set_coverage.py --sims 20000    # standard error of a coverage ~ 0.0015

The table it prints is in docs/evaluation.md ("Coverage of the intervals"); tests/test_seed_set_coverage.py runs a
small form.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpolab.evaluation.intervals import t_quantile  # noqa: E402
from grpolab.evaluation.sets import set_mean  # noqa: E402

PROBLEMS = 266  # the demo's held-out set
POPULATIONS = ((0.3, 0.10), (0.5, 0.05))  # (base accuracy p0, true gain)
SDS = (0.0, 0.04, 0.08, 0.12)
MIXTURES = ((0.0, 0.2, 0.15), (0.04, 0.2, 0.15))  # (sd, fail probability, loss): one seed in five losing 0.15
METHODS = ("two-part t", "ANOVA", "old")


def _positive_part(m: float, sd: float) -> float:
    """E[max(0, m + u)], u ~ N(0, sd^2): m Phi(m/sd) + sd phi(m/sd) (max(m, 0) for sd = 0)."""
    if sd == 0:
        return max(m, 0.0)
    z = m / sd
    return m * 0.5 * (1 + math.erf(z / math.sqrt(2))) + sd * math.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def true_gain(p0: float, gain: float, sd: float, fail: float = 0.0, loss: float = 0.0) -> float:
    """E[clip(gain + u - loss B, -p0, 1 - p0)]: E[clip(m + u, a, b)] = a + E[(m + u - a)+] - E[(m + u - b)+]."""

    def clipped(m: float) -> float:
        return -p0 + _positive_part(m + p0, sd) - _positive_part(m - (1 - p0), sd)

    return (1 - fail) * clipped(gain) + fail * clipped(gain - loss)


def draw_sets(
    rng: np.random.Generator, sims: int, runs: int, p0: float, gain: float, sd: float, fail: float, loss: float
) -> np.ndarray:
    """(sims, runs, PROBLEMS) paired gains d_{r,i} = trained_r - base of `sims` simulated sets."""
    q = rng.beta(2 * p0, 2 * (1 - p0), (sims, 1, PROBLEMS))
    base = rng.random((sims, 1, PROBLEMS)) < q
    g = gain + (rng.normal(0.0, sd, (sims, runs, 1)) if sd > 0 else 0.0) - loss * (rng.random((sims, runs, 1)) < fail)
    g = np.clip(g, -p0, 1 - p0)
    rate = np.where(g >= 0, q + g * (1 - q) / (1 - p0), q * (1 + g / p0))
    return (rng.random((sims, runs, PROBLEMS)) < rate).astype(float) - base


def reference_intervals(x: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(theta, half-width) per set of the ANOVA and old intervals, vectorised over the first axis."""
    _, r, p = x.shape
    m, c, theta = x.mean(axis=2), x.mean(axis=1), x.mean(axis=(1, 2))
    s_m2, s_d2 = m.var(axis=1, ddof=1), c.var(axis=1, ddof=1)
    ms_e = ((x - m[:, :, None] - c[:, None, :] + theta[:, None, None]) ** 2).sum(axis=(1, 2)) / ((r - 1) * (p - 1))
    w = ms_e / p
    u0, u_r, u_e = s_d2 / p, s_m2 / r, -w / r  # Satterthwaite terms of the unbiased combination
    satt = (u0 + u_r + u_e) ** 2 / (u0**2 / (p - 1) + u_r**2 / (r - 1) + u_e**2 / ((r - 1) * (p - 1)))
    nu = np.where(s_m2 > w, satt, p - 1)
    tq = np.array([t_quantile(0.975, v) for v in nu])
    return {
        "ANOVA": (theta, tq * np.sqrt(u0 + np.maximum(s_m2, w) / r - w / r)),
        "old": (theta, tq * np.sqrt(u0 + u_r)),
    }


def case(sims: int, runs: int, p0: float, gain: float, sd: float, fail: float = 0.0, loss: float = 0.0, seed: int = 0):
    """{method: {coverage, above, below, width}} on `sims` simulated sets, plus "one run" (the mean width of one run's
    paired t interval) and the truth."""
    x = draw_sets(np.random.default_rng(seed), sims, runs, p0, gain, sd, fail, loss)
    truth = true_gain(p0, gain, sd, fail, loss)
    bounds = {k: (th - h, th + h) for k, (th, h) in reference_intervals(x).items()}
    ours = [set_mean(s) for s in x]
    bounds["two-part t"] = (np.array([o["ci_low"] for o in ours]), np.array([o["ci_high"] for o in ours]))
    out = {}
    for k, (lo, hi) in bounds.items():
        lo, hi = np.maximum(lo, -1.0), np.minimum(hi, 1.0)
        out[k] = {
            "coverage": float(np.mean((lo <= truth) & (truth <= hi))),
            "above": float(np.mean(lo > truth)),
            "below": float(np.mean(hi < truth)),
            "width": float(np.mean(hi - lo)),
        }
    one = x[:, 0, :]
    out["one run"] = float(np.mean(2 * t_quantile(0.975, PROBLEMS - 1) * one.std(axis=1, ddof=1) / math.sqrt(PROBLEMS)))
    out["truth"] = truth
    return out


def cases() -> list[tuple[str, int, float, float, float, float, float]]:
    """(label, runs, p0, gain, sd, fail, loss) of every row of the table."""
    rows = []
    for runs in (3, 5):
        for p0, gain in POPULATIONS:
            for sd in SDS:
                rows.append((f"{runs} seeds, base {p0}, gain +{gain:.2f}, SD {sd:.2f}", runs, p0, gain, sd, 0.0, 0.0))
            for sd, fail, loss in MIXTURES:
                label = f"{runs} seeds, base {p0}, gain +{gain:.2f}, SD {sd:.2f}, 1 in 5 seeds -{loss}"
                rows.append((label, runs, p0, gain, sd, fail, loss))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=4000, help="simulated sets per case")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("| case (266 problems) | two-part t: coverage / above / below / width | ANOVA | old | one run width |")
    print("|---|---|---|---|---|")
    for label, runs, p0, gain, sd, fail, loss in cases():
        r = case(args.sims, runs, p0, gain, sd, fail, loss, args.seed)
        cells = [
            f"{r[m]['coverage']:.3f} / {r[m]['above']:.3f} / {r[m]['below']:.3f} / {r[m]['width']:.3f}" for m in METHODS
        ]
        print(f"| {label} | " + " | ".join(cells) + f" | {r['one run']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
