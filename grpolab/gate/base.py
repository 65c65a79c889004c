"""What every release check shares: the statuses, :class:`CheckResult`, :class:`Thresholds` and the helpers on
metric rows and on the run's resolved config (pure functions on plain dicts and lists).

Statuses: PASS / WARN / FAIL, and N/A for a check that cannot fail in the run's configuration (e.g. the KL to
a reference model when algorithm.beta = 0, so there is none). An N/A check says why in its reason and does
not count toward the verdict as a pass. Every check that can PASS has a minimum of evidence (steps, problems,
prompts, samples); below it the check is N/A "too little evidence (n = X < MIN)" with ``measured`` False, which
keeps the verdict from "ship" (too_little_evidence).

FAIL rules are one-sided tests: each check that can FAIL records, per hypothesis of harm, the one-sided p-value
of "no harm" (harm_p_value, from its 95% interval) in ``CheckResult.fail_tests``; grpolab.gate.family.family_control
keeps a FAIL only where Holm's step-down procedure over all of them rejects at the family-wise level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from .thresholds import Thresholds

PASS, WARN, FAIL, NA = "PASS", "WARN", "FAIL", "N/A"
SEVERITY = {NA: -1, PASS: 0, WARN: 1, FAIL: 2}
STATUSES = (FAIL, WARN, PASS, NA)  # report order


@dataclass
class CheckResult:
    """One check's outcome. `measured` is False when the evidence for it was missing ("not measured") or too little
    (N/A "too little evidence"): the verdict is then not "ship".

    status N/A: the check cannot fail in this run's configuration, or has too little evidence; `reason` says why.
    `fail_tests`: for a check that can FAIL, {hypothesis label: {"p": one-sided p-value of no harm, "fails": whether
    the check's own 95% rule FAILs it}} -- the input of the family-wise correction (family.family_control).
    `noninferiority`: for a check of harm, {dimension label: record (gate/noninferiority.py noninferiority_record)}:
    whether its interval shows the trained model no worse than the margin; the verdict needs each, or its waiver.
    """

    name: str
    group: str
    status: str
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)
    measured: bool = True
    fail_tests: dict[str, dict[str, Any]] = field(default_factory=dict)
    noninferiority: dict[str, dict[str, Any]] = field(default_factory=dict)


# ---------------------------------------------------------------- metric rows


def values(rows: Sequence[dict[str, Any]], key: str) -> list[float]:
    """Finite values of `key` in step order (missing and null entries skipped)."""
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def early_late(vals: Sequence[float], frac: float) -> tuple[float, float]:
    """Means of the first and last ceil(frac * n) values (at least 1 each)."""
    k = max(1, math.ceil(frac * len(vals)))
    return sum(vals[:k]) / k, sum(vals[-k:]) / k


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; 0.0 when either side is constant (no linear relation to measure).

    >>> pearson([1, 2, 3], [2, 4, 6])
    1.0
    >>> pearson([1, 2, 3], [5, 5, 5])
    0.0
    """
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx <= 1e-24 or syy <= 1e-24:
        return 0.0
    return round(sum((a - mx) * (b - my) for a, b in zip(x, y)) / math.sqrt(sxx * syy), 12)


def paired(rows: Sequence[dict[str, Any]], a: str, b: str) -> tuple[list[float], list[float]]:
    """Values of `a` and `b` from the rows where both are finite."""
    xs, ys = [], []
    for r in rows:
        va, vb = values([r], a), values([r], b)
        if va and vb:
            xs.append(va[0])
            ys.append(vb[0])
    return xs, ys


def r4(x: float) -> float:
    return round(float(x), 4)


def too_little_evidence(
    name: str,
    group: str,
    what: str,
    n: int | None,
    minimum: int,
    numbers: dict[str, Any] | None = None,
    blocks_ship: bool = True,
) -> CheckResult:
    """N/A "too little evidence (n = X < MIN)": a check below its minimum of evidence cannot PASS. With `blocks_ship`
    (the default) it is not measured evidence (``measured`` False) and keeps the verdict from "ship"; an optional
    measurement (pass@k) passes False and the verdict rests on the rest.

    >>> too_little_evidence("x", "g", "held-out problems", 1, 30).reason
    'too little evidence (n = 1 < 30 held-out problems)'
    """
    shown = "unknown" if n is None else n
    return CheckResult(
        name,
        group,
        NA,
        f"too little evidence (n = {shown} < {minimum} {what})",
        {**(numbers or {}), "n": n, "min": minimum},
        measured=not blocks_ship,
    )


def too_few(name: str, group: str, key: str, n: int, t: Thresholds) -> CheckResult:
    """A trend check with fewer than `min_points` finite values of `key`: N/A too little evidence."""
    return too_little_evidence(name, group, f"steps with {key}", n, t.min_points, {"points": n})


def not_measured(name: str, group: str, what: str, numbers: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult(name, group, WARN, f"not measured: {what}", numbers or {}, measured=False)


def not_applicable(name: str, group: str, why: str, numbers: dict[str, Any] | None = None) -> CheckResult:
    """N/A: the check cannot fail in this run's configuration (`why` says which setting makes it so)."""
    return CheckResult(name, group, NA, why, numbers or {})


def grade(value: float, warn: float, above: bool = True) -> str:
    """WARN/PASS of a training-health value against its WARN threshold (above=True: larger is worse, inclusive;
    above=False: WARN strictly below). Training-health values have no interval, so they never FAIL.

    >>> grade(0.3, 0.2), grade(0.1, 0.2), grade(0.19, 0.2, above=False)
    ('WARN', 'PASS', 'WARN')
    """
    return WARN if (value >= warn if above else value < warn) else PASS


# ---------------------------------------------------------------- the run's resolved config


def setting(config: dict[str, Any] | None, path: str) -> Any:
    """config["a"]["b"] for path "a.b", or None when any level is missing (an older manifest: unknown).

    >>> setting({"train": {"mu": 1}}, "train.mu"), setting({"train": {}}, "train.minibatches"), setting(None, "x")
    (1, None, None)
    """
    node: Any = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _number(config: dict[str, Any] | None, path: str) -> float | None:
    v = setting(config, path)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def single_step_on_policy(config: dict[str, Any] | None) -> bool:
    """True only when the config says train.mu == 1 and train.minibatches == 1: one optimizer step per rollout
    batch, taken with the policy that sampled it (pi_theta == pi_old, the ratio is 1 by construction).
    False when either is larger or unknown.

    >>> single_step_on_policy({"train": {"mu": 1, "minibatches": 1}}), single_step_on_policy({"train": {"mu": 1}})
    (True, False)
    """
    return _number(config, "train.mu") == 1 and _number(config, "train.minibatches") == 1


def no_reference_model(config: dict[str, Any] | None) -> bool:
    """True only when the config says algorithm.beta == 0 (the trainer then loads no reference model)."""
    return _number(config, "algorithm.beta") == 0


def reward_weights(config: dict[str, Any] | None) -> dict[str, float] | None:
    """config.reward.weights, or None when the manifest does not record them (unknown)."""
    w = setting(config, "reward.weights")
    return dict(w) if isinstance(w, dict) else None


def correctness_component(weights: dict[str, float] | None) -> str:
    """The reward component that says whether a completion is right: the first of `correct`, `all_pass`,
    `pass_fraction`, `env` (an agent environment's end-state verdict; grpolab.rewards.CORRECTNESS_REWARDS) with a
    positive weight; `correct` when none is weighted or the weights are unknown.

    >>> correctness_component({"pass_fraction": 1.0}), correctness_component(None)
    ('pass_fraction', 'correct')
    """
    from ..rewards import CORRECTNESS_REWARDS

    return next((c for c in CORRECTNESS_REWARDS if _positive((weights or {}).get(c))), "correct")


def reward_is_correctness(config: dict[str, Any] | None, kl_logged_apart: bool = False) -> bool:
    """True only when the config proves the logged reward/mean is a positive multiple of correctness:
    reward.weights has the correctness component (correctness_component: `correct`, or a code task's `all_pass` /
    `pass_fraction`) > 0 and every other weight 0, algorithm.overlong_buffer == 0 (no length penalty), and no KL
    term in reward/mean: algorithm.beta == 0, or kl_placement is not "reward", or `kl_logged_apart` (the run logs
    the KL penalty as reward/kl_penalty/mean and keeps reward/mean the task reward; older runs subtracted it from
    reward/mean). Unknown fields: False.

    >>> reward_is_correctness({"reward": {"weights": {"correct": 1.0, "format": 0.0}},
    ...                        "algorithm": {"overlong_buffer": 0, "beta": 0.0}})
    True
    """
    weights = reward_weights(config)
    key = correctness_component(weights)
    if not weights or not _positive(weights.get(key)):
        return False
    if any(w != 0 for c, w in weights.items() if c != key):
        return False
    if _number(config, "algorithm.overlong_buffer") != 0:
        return False
    beta = _number(config, "algorithm.beta")
    placement = setting(config, "algorithm.kl_placement")
    return beta == 0 or (placement is not None and placement != "reward") or (beta is not None and kl_logged_apart)


def _positive(w: Any) -> bool:
    return isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0
