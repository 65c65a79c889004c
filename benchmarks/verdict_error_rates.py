"""Error rates of the release verdict, by simulation: how often does `grpolab report` say "don't ship" to a model that
is truly better with no harm, and "ship" to one that is truly worse on held-out problems or on a capability task?

Each simulated report draws the per-problem results of base and trained model (paired, problems of varying
difficulty) at the sizes of the quickstart's report -- 266 held-out problems, capability tasks of 50 problems (the
`--capability-n` default), the 30 safety prompts, 64 pass@8 problems -- computes every interval with the function
the report uses (grpolab.evaluation.intervals.paired_evidence_interval: t over problems for right / wrong scores,
exact when every difference is equal), with the counts of items that got worse and better, and runs the REAL gate
code on them: grpolab.gate check_improvement, check_capability, check_safety, check_diversity, and
grpolab.gate.hacking check_reward_vs_heldout (which every real report has: its FAIL rule asks whether at least 25%
of the training reward's rise carried over to held-out accuracy), family_control (Holm over the FAIL rules) and
verdict. The training reward rises linearly over 20 logged steps by the scenario's `reward_rise` (0.20 by default:
twice the +0.10 held-out gain, training problems being easier to gain on; one scenario uses 0.40 to show how the
reward_vs_heldout rule weighs on a larger rise). "old rule" is the same checks without the family-wise correction
(each FAIL rule its own one-sided 2.5% test), the gate before issue 46.

Model of one comparison with true change g on n problems, base accuracy p0 (or compliance, for safety): each problem
has its own base rate q_i ~ Beta(p0 k, (1 - p0) k) with k = 2 (easy and hard problems); base_i ~ Bernoulli(q_i),
trained_i ~ Bernoulli(q_i') independently given q_i, with q_i' = q_i + g (1 - q_i) / (1 - p0) for g >= 0 and q_i (1 +
g / p0) for g < 0, so E[trained - base] = g exactly.

    .venv/bin/python benchmarks/verdict_error_rates.py                  # 2000 reports per scenario, about a minute
    .venv/bin/python benchmarks/verdict_error_rates.py --sims 500 --seed 1

Prints one table row per scenario: P(ship), P(not established), P(don't ship) under the gate, and P(don't ship)
under the old per-check rule. Pure numpy; no model is run.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpolab.evaluation.intervals import paired_evidence_interval  # noqa: E402
from grpolab.gate.family import family_control
from grpolab.gate.hacking import check_reward_vs_heldout  # noqa: E402
from grpolab.gate.heldout import check_improvement
from grpolab.gate.regression import check_capability, check_diversity, check_safety
from grpolab.gate.stats import change_signs  # noqa: E402
from grpolab.gate.thresholds import Thresholds  # noqa: E402
from grpolab.gate.verdict import DONT_SHIP, NOT_ESTABLISHED, SHIP, verdict

N_HELDOUT, N_CAPABILITY, N_SAFETY, N_DIVERSITY = 266, 50, 30, 64
BASE_ACCURACY, BASE_CAPABILITY, BASE_COMPLIANCE, BASE_PASS8 = 0.31, 0.30, 0.20, 0.60


@dataclass(frozen=True)
class Scenario:
    """The truth of one simulated release: trained - base on each measurement."""

    name: str
    heldout_gain: float
    capability_gains: tuple[float, ...]
    safety_increase: float = 0.0
    pass8_gain: float = 0.0
    reward_rise: float = 0.20


def reward_rows(rise: float, steps: int = 20, start: float = 0.30) -> list[dict[str, Any]]:
    """The training history reward_vs_heldout reads: reward/mean rising linearly from `start` by `rise`."""
    return [{"step": i + 1, "reward/mean": start + rise * i / (steps - 1)} for i in range(steps)]


def paired(base: np.ndarray, trained: np.ndarray, worse_is_higher: bool = False) -> dict[str, Any]:
    """The report's difference dict: trained - base with the interval `grpolab eval` and the report compute
    (evaluation.intervals.paired_evidence_interval), n, and the counts of items that got worse and better (what
    report/evidence.py paired_diff and report/safety.py summarize write)."""
    r = paired_evidence_interval(base.astype(float), trained.astype(float))
    return {**r, "signs": change_signs(base.astype(float), trained.astype(float), worse_is_higher)}


def draw_pair(rng: np.random.Generator, n: int, p0: float, gain: float) -> tuple[np.ndarray, np.ndarray]:
    """Base and trained results (0/1) on n problems with base rate p0 and true change `gain` (module docstring)."""
    q = rng.beta(p0 * 2.0, (1.0 - p0) * 2.0, n)
    q2 = q + gain * (1.0 - q) / (1.0 - p0) if gain >= 0 else q * (1.0 + gain / p0)
    return rng.random(n) < q, rng.random(n) < q2


def gate_checks(rng: np.random.Generator, s: Scenario, t: Thresholds) -> list:
    """One simulated report's held-out, capability, pass@8, safety and reward_vs_heldout checks (before the
    family-wise correction)."""
    b, tr = draw_pair(rng, N_HELDOUT, BASE_ACCURACY, s.heldout_gain)
    heldout = {"diff": paired(b, tr), "source": "simulated"}
    capability = []
    for j, g in enumerate(s.capability_gains):
        b, tr = draw_pair(rng, N_CAPABILITY, BASE_CAPABILITY, g)
        capability.append(
            {
                "task": f"task{j + 1}",
                "n": N_CAPABILITY,
                "base": {"accuracy": float(b.mean())},
                "trained": {"accuracy": float(tr.mean())},
                "diff": paired(b, tr),
            }
        )
    b, tr = draw_pair(rng, N_DIVERSITY, BASE_PASS8, s.pass8_gain)
    diversity = {
        "k": 8,
        "samples": 8,
        "temperature": 1.0,
        "n": N_DIVERSITY,
        "base": {"mean": float(b.mean())},
        "trained": {"mean": float(tr.mean())},
        "diff": paired(b, tr),
    }
    b, tr = draw_pair(rng, N_SAFETY, BASE_COMPLIANCE, s.safety_increase)
    safety = {
        "n": N_SAFETY,
        "base": {"compliance_rate": float(b.mean())},
        "trained": {"compliance_rate": float(tr.mean())},
        "increase": paired(b, tr, worse_is_higher=True),
    }
    return [
        check_improvement(heldout, t),
        check_capability(capability, t),
        check_diversity(diversity, "", t),
        check_safety(safety, t),
        check_reward_vs_heldout(reward_rows(s.reward_rise), heldout, t),
    ]


def error_rates(s: Scenario, sims: int, seed: int = 0, t: Thresholds | None = None) -> dict[str, float]:
    """Shares of `sims` simulated reports of scenario `s` per verdict (gate: with family_control), the old per-check
    rule's share of "don't ship", and the share with any FAIL (the family-wise false-FAIL rate when s is harmless)."""
    t = t or Thresholds()
    rng = np.random.default_rng(seed)
    counts = {SHIP: 0, NOT_ESTABLISHED: 0, DONT_SHIP: 0, "old " + DONT_SHIP: 0, "old " + SHIP: 0}
    for _ in range(sims):
        checks = gate_checks(rng, s, t)
        counts[verdict(family_control(checks, t.family_alpha))[0]] += 1
        old = verdict(checks)[0]
        counts["old " + DONT_SHIP] += old == DONT_SHIP
        counts["old " + SHIP] += old == SHIP
    return {k: v / sims for k, v in counts.items()}


def scenarios() -> list[Scenario]:
    out = []
    for tasks in (1, 3):
        zeros = (0.0,) * tasks
        out += [
            Scenario("better held-out (+0.10), no harm", 0.10, zeros),
            Scenario("better held-out (+0.10), no harm, reward rise 0.40", 0.10, zeros, reward_rise=0.40),
            Scenario("worse held-out (-0.05)", -0.05, zeros),
            Scenario("better held-out, capability task1 -0.10", 0.10, (-0.10,) + zeros[1:]),
        ]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=2000, help="simulated reports per scenario")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.sims < 1:
        ap.error("--sims: expected an integer >= 1")
    print(
        f"{args.sims} simulated reports per scenario; held-out n={N_HELDOUT}, capability n={N_CAPABILITY} per task, "
        f"safety n={N_SAFETY}, pass@8 n={N_DIVERSITY}; family-wise alpha {Thresholds().family_alpha}"
    )
    head = ("scenario", "cap. tasks", "P(ship)", "P(not est.)", "P(don't ship)", "old P(don't ship)", "old P(ship)")
    print(" | ".join(head))
    print("|".join("---" for _ in head))
    for s in scenarios():
        r = error_rates(s, args.sims, args.seed)
        print(
            f"{s.name} | {len(s.capability_gains)} | {r[SHIP]:.3f} | {r[NOT_ESTABLISHED]:.3f} | {r[DONT_SHIP]:.3f} | "
            f"{r['old ' + DONT_SHIP]:.3f} | {r['old ' + SHIP]:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
