"""Error rates of the release gate under non-inferiority (issue 60), by simulation: P(ship) when there is no true
gain, when one harm dimension truly drops by its margin, and when the model is truly better (+0.10) and harmless.

Each simulated report draws paired per-item results of base and trained model, computes every interval with the
function the report uses (grpolab.evaluation.intervals.paired_evidence_interval: t over items, exact when every
difference is equal) with the counts of items that got worse and better (stats.change_signs), and runs grpolab's own
gate: check_improvement, check_capability, check_diversity, check_safety, check_reward_vs_heldout (the training
correctness, reward/correct/mean, rising by 0.20 over 20 steps, against the held-out pass@1 sampled at the training
temperature, as the report pairs them: gate.hacking.transfer_comparison), then verdict.judged (Holm over the FAIL
rules, the user's waivers) and verdict.verdict. "blocked under --strict" is every verdict but ship.

Model of one comparison with true change g on n items, base rate p0: each item has its own base rate q_i ~ Beta(p0 c,
(1 - p0) c) (c = --concentration, 2 by default as in verdict_error_rates.py: easy and hard problems); base_i ~
Bernoulli(q_i) and trained_i ~ Bernoulli(q_i') independently given q_i, q_i' = q_i + g (1 - q_i) / (1 - p0) for g >= 0
and q_i (1 + g / p0) for g < 0, so E[trained - base] = g. The share of items whose answer changes is then
2 p0 (1 - p0) c / (c + 1): 0.28 for capability (p0 = 0.30), 0.21 for safety (compliance 0.20), 0.32 for pass@8
(0.60, drawn as solved / not solved within 8 tries). Base rates: held-out 0.31, capability 0.30, compliance 0.20,
pass@8 0.60. The pass@1 that reward_vs_heldout reads: on the pass@8 problems, 8 samples per problem (c_i ~
Binomial(8, q_i), q_i as above with the held-out base rate and gain), pass@1 = c_i / 8, drawn apart from the pass@8
outcomes; its paired interval is t over problems (the report's studentised bootstrap is close at 64 problems,
docs/evaluation.md, and 30 times slower).

Two sizes: make demo's report (266 held-out problems, 39 capability problems, pass@8 on 266 problems, safety waived:
the bundled model refuses 1 of the 30 prompts), and
"sized": each harm dimension at the n that grpolab.gate.noninferiority.problems_needed gives for 97% power at its
margin under this model, and the held-out set at the n that detects +0.10 with 97% power (the same formula).

    .venv/bin/python benchmarks/gate_error_rates.py                 # 2000 reports per scenario
    .venv/bin/python benchmarks/gate_error_rates.py --sims 500 --seed 1 --concentration 0.5

Pure numpy; no model is run.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpolab.evaluation.intervals import paired_evidence_interval, paired_interval  # noqa: E402
from grpolab.gate.hacking import check_reward_vs_heldout, transfer_comparison  # noqa: E402
from grpolab.gate.heldout import check_improvement  # noqa: E402
from grpolab.gate.noninferiority import problems_needed  # noqa: E402
from grpolab.gate.regression import check_capability, check_diversity, check_safety  # noqa: E402
from grpolab.gate.stats import Z95, change_signs  # noqa: E402
from grpolab.gate.thresholds import Thresholds  # noqa: E402
from grpolab.gate.verdict import DONT_SHIP, NOT_ESTABLISHED, SHIP, judged, verdict  # noqa: E402

BASE_ACCURACY, BASE_CAPABILITY, BASE_COMPLIANCE, BASE_PASS8 = 0.31, 0.30, 0.20, 0.60
ALL_HARM = ("capability", "pass_at_k", "safety")
CONFIG = {"rollout": {"temperature": 1.0}, "weights": {"correct": 1.0}}  # the diversity eval samples at T = 1


@dataclass(frozen=True)
class Sizes:
    """Items per evaluation: held-out problems, capability problems (one task), safety prompts, pass@8 problems; and
    the harm dimensions a report at these sizes waives (make demo: safety)."""

    name: str
    heldout: int
    capability: int
    safety: int
    pass8: int
    waived: tuple[str, ...] = ()


# make demo's report: every held-out problem, the 39 held-out products, pass@8 on all 266 held-out problems; safety
# waived (the bundled model refuses 1 of the 30 prompts: no refusal behaviour to lose, and 30 cannot show 0.05)
DEMO = Sizes("make demo", 266, 39, 30, 266, waived=("safety",))


@dataclass(frozen=True)
class Scenario:
    """The truth of one simulated release (trained - base on each measurement), the waivers, and the bound the
    printed rate is held to: ("<=", x) or (">=", x)."""

    name: str
    heldout_gain: float
    capability_gain: float = 0.0
    pass8_gain: float = 0.0
    safety_increase: float = 0.0
    waived: tuple[str, ...] = ()
    target: tuple[str, float] | None = None
    harms: str = ""  # the harm dimension the scenario's bound is about, where it is one a report may waive


def changed_share(p0: float, concentration: float) -> float:
    """The share of items whose result changes with no true change: 2 E[q (1 - q)] = 2 p0 (1 - p0) c / (c + 1).

    >>> round(changed_share(0.30, 2.0), 4)
    0.28
    """
    return 2.0 * p0 * (1.0 - p0) * concentration / (concentration + 1.0)


def sized(margin_gain: float, p0: float, concentration: float, power: float) -> int:
    """The n at which grpolab's own power calculation (noninferiority.problems_needed) reaches `power` for a margin
    (or gain) of `margin_gain`, fed the interval one item of this model gives: sigma^2 = changed_share."""
    sd = math.sqrt(changed_share(p0, concentration))
    one_item = {"mean": 0.0, "ci_low": -Z95 * sd, "ci_high": Z95 * sd}
    return int(problems_needed(one_item, 1, margin_gain, power) or 0)


def sized_sizes(t: Thresholds, concentration: float, power: float = 0.97) -> Sizes:
    """Every evaluation at the n for `power` (module docstring), held-out for a +0.10 gain."""
    return Sizes(
        f"sized ({power:.0%} power each)",
        sized(0.10, BASE_ACCURACY, concentration, power),
        sized(t.capability_margin, BASE_CAPABILITY, concentration, power),
        sized(t.safety_margin, BASE_COMPLIANCE, concentration, power),
        sized(t.diversity_margin, BASE_PASS8, concentration, power),
    )


def draw_pair(rng: np.random.Generator, n: int, p0: float, gain: float, c: float) -> tuple[np.ndarray, np.ndarray]:
    """Base and trained results (0/1) on n items with base rate p0 and true change `gain` (module docstring)."""
    q = rng.beta(p0 * c, (1.0 - p0) * c, n)
    q2 = q + gain * (1.0 - q) / (1.0 - p0) if gain >= 0 else q * (1.0 + gain / p0)
    return (rng.random(n) < q).astype(float), (rng.random(n) < q2).astype(float)


def paired(base: np.ndarray, trained: np.ndarray, worse_is_higher: bool = False) -> dict[str, Any]:
    """The report's difference record: paired_evidence_interval and the counts of items that got worse and better."""
    return {**paired_evidence_interval(base, trained), "signs": change_signs(base, trained, worse_is_higher)}


def reward_rows(rise: float = 0.20, steps: int = 20, start: float = 0.30) -> list[dict[str, Any]]:
    """The training history reward_vs_heldout reads: the correctness (the whole reward) rising linearly from `start`
    by `rise`."""
    rows = [{"step": i + 1, "reward/mean": start + rise * i / (steps - 1)} for i in range(steps)]
    return [{**r, "reward/correct/mean": r["reward/mean"]} for r in rows]


def sampled_pass1(rng: np.random.Generator, n: int, p0: float, gain: float, c: float) -> dict[str, Any]:
    """pass@1 from 8 samples per problem on n problems, trained - base, with its paired t interval (module
    docstring)."""
    q = rng.beta(p0 * c, (1.0 - p0) * c, n)
    q2 = q + gain * (1.0 - q) / (1.0 - p0) if gain >= 0 else q * (1.0 + gain / p0)
    return paired_interval(rng.binomial(8, q) / 8.0, rng.binomial(8, q2) / 8.0)


def simulated_checks(rng: np.random.Generator, s: Scenario, z: Sizes, t: Thresholds, c: float) -> list:
    """One simulated report's checks, before Holm and the waivers."""
    b, tr = draw_pair(rng, z.heldout, BASE_ACCURACY, s.heldout_gain, c)
    heldout = {"diff": paired(b, tr), "source": "simulated"}
    b, tr = draw_pair(rng, z.capability, BASE_CAPABILITY, s.capability_gain, c)
    capability = [
        {"task": "task1", "n": z.capability, "base": {"accuracy": b.mean()}, "trained": {"accuracy": tr.mean()}}
        | {"diff": paired(b, tr)}
    ]
    b, tr = draw_pair(rng, z.pass8, BASE_PASS8, s.pass8_gain, c)
    diversity = {"k": 8, "samples": 8, "temperature": 1.0, "n": z.pass8, "base": {"mean": b.mean()}}
    diversity |= {"trained": {"mean": tr.mean()}, "diff": paired(b, tr)}
    diversity["pass1"] = sampled_pass1(rng, z.pass8, BASE_ACCURACY, s.heldout_gain, c)
    b, tr = draw_pair(rng, z.safety, BASE_COMPLIANCE, s.safety_increase, c)
    safety = {"n": z.safety, "base": {"compliance_rate": b.mean()}, "trained": {"compliance_rate": tr.mean()}}
    safety["increase"] = paired(b, tr, worse_is_higher=True)
    return [
        check_improvement(heldout, t),
        check_capability(capability, t),
        check_diversity(diversity, "", t),
        check_safety(safety, t),
        check_reward_vs_heldout(reward_rows(), transfer_comparison(heldout, diversity, CONFIG), t, CONFIG["weights"]),
    ]


def rates(s: Scenario, z: Sizes, sims: int, seed: int = 0, concentration: float = 2.0) -> dict[str, float]:
    """Shares of `sims` simulated reports of scenario `s` at sizes `z` per verdict, through grpolab's gate."""
    t, rng = Thresholds(), np.random.default_rng(seed)
    counts = {SHIP: 0, NOT_ESTABLISHED: 0, DONT_SHIP: 0}
    for _ in range(sims):
        checks = judged(simulated_checks(rng, s, z, t, concentration), t, tuple(dict.fromkeys(s.waived + z.waived)))
        counts[verdict(checks)[0]] += 1
    return {k: v / sims for k, v in counts.items()}


def scenarios(t: Thresholds) -> list[Scenario]:
    """The scenarios of issue 60's bounds: no gain (<= 2.5%), a drop of the margin on one dimension (<= 5%), a
    +0.10 gain with no harm (>= 80%), each also with every harm dimension waived where that is the question."""
    return [
        Scenario("no true gain", 0.0, target=("<=", 0.025)),
        Scenario("no true gain, all harm waived", 0.0, waived=ALL_HARM, target=("<=", 0.025)),
        Scenario("+0.10, capability -margin", 0.10, capability_gain=-t.capability_margin, target=("<=", 0.05)),
        Scenario("+0.10, pass@8 -margin", 0.10, pass8_gain=-t.diversity_margin, target=("<=", 0.05)),
        Scenario("+0.10, safety +margin", 0.10, safety_increase=t.safety_margin, target=("<=", 0.05), harms="safety"),
        Scenario("+0.10, no harm", 0.10, target=(">=", 0.80)),
        Scenario("+0.10, no harm, all harm waived", 0.10, waived=ALL_HARM),
    ]


def verdict_on_bound(rate: float, target: tuple[str, float], sims: int) -> str:
    """ "yes" when the estimated rate meets the bound, "within MC error" when it misses by less than two binomial
    standard errors of an estimate from `sims` reports at the bound (sqrt(x (1 - x) / sims)), else "NO".

    >>> verdict_on_bound(0.026, ("<=", 0.025), 2000), verdict_on_bound(0.79, (">=", 0.8), 2000)
    ('within MC error', 'within MC error')
    """
    op, x = target
    if rate <= x if op == "<=" else rate >= x:
        return "yes"
    return "within MC error" if abs(rate - x) <= 2 * math.sqrt(x * (1 - x) / sims) else "NO"


def table(sims: int, seed: int, concentration: float) -> list[str]:
    """The printed table: one row per size set and scenario."""
    t = Thresholds()
    head = ("sizes (held-out/cap/safety/pass@8)", "scenario", "P(ship)", "P(not est.)", "P(don't ship)")
    head += ("P(blocked, --strict)", "bound", "met")
    lines = [" | ".join(head), "|".join("---" for _ in head)]
    print("\n".join(lines), flush=True)
    for z in (DEMO, sized_sizes(t, concentration)):
        label = f"{z.name}: {z.heldout}/{z.capability}/{z.safety}/{z.pass8}"
        for s in scenarios(t):
            r = rates(s, z, sims, seed, concentration)
            bound, met = "-", "-"
            if s.target and s.harms in z.waived:
                bound, met = "waived", "-"  # the harm is accepted at these sizes: no bound on shipping it
            elif s.target:
                bound, met = f"{s.target[0]} {s.target[1]:g}", verdict_on_bound(r[SHIP], s.target, sims)
            lines.append(
                f"{label} | {s.name} | {r[SHIP]:.3f} | {r[NOT_ESTABLISHED]:.3f} | {r[DONT_SHIP]:.3f} | "
                f"{1 - r[SHIP]:.3f} | {bound} | {met}"
            )
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000, help="simulated reports per scenario")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concentration", type=float, default=2.0, help="c of the items' Beta rates (module docstring)")
    args = ap.parse_args(argv)
    if args.sims < 1 or args.concentration <= 0:
        ap.error("--sims: an integer >= 1; --concentration: > 0")
    t = Thresholds()
    print(
        f"{args.sims} simulated reports per scenario, seed {args.seed}, concentration {args.concentration:g}; margins: "
        f"capability {t.capability_margin:g}, pass@8 {t.diversity_margin:g}, safety {t.safety_margin:g}; "
        f"family-wise alpha {t.family_alpha:g}"
    )
    table(args.sims, args.seed, args.concentration)


if __name__ == "__main__":
    main()
