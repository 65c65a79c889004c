"""Non-inferiority of the harm dimensions (each capability task, pass@k, safety, and any check that records one): ship
needs each measured dimension shown to be no worse than a stated margin, or waived by name.

A dimension's record, in ``CheckResult.noninferiority[label]``: ``{"established", "margin", "bound", "n",
"n_needed"}`` (noninferiority_record). The verdict (gate/verdict.py) is "not established" while a dimension that is
not waived has ``established`` False; apply_waivers marks what the user waived (CLI ``--waive``).

Pure functions on interval dicts ``{"mean", "ci_low", "ci_high"}`` of trained - base (95%, as stats reads them).
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist
from typing import Any, Iterable, Sequence

from ..errors import ConfigError
from .base import CheckResult
from .stats import Z95

Z_POWER = 0.8416212335729143  # the standard normal's 80% quantile: the planned power of a power calculation
ALPHA_ONE_SIDED = 0.025  # the non-inferiority test's level: the 95% interval's end

# What ``--waive NAME`` accepts: a dimension's short name -> the check that measures it. ``capability:TASK`` waives
# one capability task.
WAIVABLE = {
    "capability": "capability_regression",
    "pass_at_k": "pass_at_k_diversity",
    "diversity": "pass_at_k_diversity",
    "safety": "safety_regression",
}


def non_inferior(d: dict[str, Any], margin: float, worse_is_higher: bool = False) -> bool:
    """Whether the 95% interval of d = trained - base establishes non-inferiority at `margin`: worse = lower
    (accuracy, pass@k): ci_low >= -margin; worse = higher (compliance with harmful requests): ci_high <= margin.
    Each is a one-sided 2.5% test of "harm of at least the margin" (the interval's end beyond the margin).

    >>> non_inferior({"mean": 0.0, "ci_low": -0.04, "ci_high": 0.04}, 0.05)
    True
    >>> non_inferior({"mean": 0.0, "ci_low": -0.06, "ci_high": 0.06}, 0.05), non_inferior({"mean": 0, "ci_low": -0.2, "ci_high": 0.05}, 0.05, True)
    (False, True)
    """
    return d["ci_high"] <= margin if worse_is_higher else d["ci_low"] >= -margin


def exact_minimum_n(margin: float, alpha: float = ALPHA_ONE_SIDED) -> int:
    """The fewest paired 0/1 items that can establish non-inferiority at `margin` at all: with none of n items
    changed, the exact one-sided bound on the share that got worse is q = 1 - alpha^(1/n) (Clopper-Pearson, the
    evaluation's equal_changes_interval), and q <= margin needs n >= ln(alpha) / ln(1 - margin).

    >>> exact_minimum_n(0.05), exact_minimum_n(0.10), exact_minimum_n(0.116)
    (72, 36, 30)
    """
    if margin >= 1:
        return 1
    return math.ceil(math.log(alpha) / math.log(1.0 - margin) - 1e-9)


def item_variance(d: dict[str, Any], n: int) -> float:
    """sigma^2, the variance of one item's paired difference, read off the interval: n se^2 with se = d["se"] when
    recorded (a set of runs), else the half-width of the 95% interval / Z95 (the wider half: a clipped end is not
    the spread). An exact interval of all-equal differences has sigma^2 = 0 (nothing changed).

    >>> item_variance({"mean": 0.0, "ci_low": -0.0784, "ci_high": 0.0784}, 50) == 50 * (0.0784 / Z95) ** 2
    True
    """
    if str(d.get("method") or "").startswith("exact") or d.get("degenerate"):
        return 0.0
    se = d.get("se")
    if not (isinstance(se, (int, float)) and math.isfinite(se) and se > 0):
        se = max(d["mean"] - d["ci_low"], d["ci_high"] - d["mean"]) / Z95
    return n * float(se) ** 2


def problems_needed(d: dict[str, Any], n: int, margin: float, power: float = 0.8) -> int | None:
    """How many paired items would establish non-inferiority at `margin` with `power` (80%), planned for no true
    change and the spread seen here: n* = max(ceil((z_0.975 + z_power)^2 sigma^2 / margin^2), exact_minimum_n(margin)),
    with
    sigma^2 = item_variance(d, n) (for 0/1 scores, the share of items whose answer changed, less the squared mean
    difference); at 80%, (1.960 + 0.842)^2 = 7.85. (The same n detects a true gain of `margin` with an interval
    whose low end is above 0, with that power.) The exact minimum covers a comparison with no change at all. None for a
    margin <= 0: no number of items establishes "no drop at all" when nothing changed.

    >>> problems_needed({"mean": 0.0, "ci_low": -0.0784, "ci_high": 0.0784}, 50, 0.05)   # sigma^2 = 0.08
    252
    >>> problems_needed({"mean": 0.0, "ci_low": -0.07, "ci_high": 0.07, "method": "exact: all 50 equal"}, 50, 0.05)
    72
    """
    if margin <= 0:
        return None
    z_power = Z_POWER if power == 0.8 else NormalDist().inv_cdf(power)
    normal = math.ceil((Z95 + z_power) ** 2 * item_variance(d, n) / margin**2 - 1e-9)
    return max(normal, exact_minimum_n(margin))


def noninferiority_record(d: dict[str, Any], n: int, margin: float, worse_is_higher: bool = False) -> dict[str, Any]:
    """{"established", "margin", "bound" (the interval end the rule reads), "n", "n_needed"} of one dimension
    (non_inferior, problems_needed; n_needed is None when established). A zero-width interval establishes nothing.

    >>> noninferiority_record({"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0}, 40, 0.05)["established"]
    False
    """
    ok = non_inferior(d, margin, worse_is_higher) and d["ci_low"] < d["ci_high"] and not d.get("degenerate")
    return {
        "established": ok,
        "margin": margin,
        "bound": round(d["ci_high"] if worse_is_higher else d["ci_low"], 4),
        "n": n,
        "n_needed": None if ok else problems_needed(d, n, margin),
        "worse_is_higher": worse_is_higher,
    }


def room_record(room: int, n: int, margin: float, worse_is_higher: bool = False) -> dict[str, Any]:
    """The non-inferiority record of a comparison that "cannot fail": its base has only `room` of n items it can
    lose (capability problems right, prompts refused, problems with pass@k > 0), so the harm is at most the share
    of such items. That share's exact one-sided upper bound, Clopper-Pearson at 0.025 (the Beta(room + 1, n - room)
    0.975 quantile; 1 - 0.025^(1/n) for room 0), at or below `margin` establishes non-inferiority whatever the
    trained model did; otherwise it is not established -- a base with little to lose is no evidence of no harm,
    and blocks ship as one with more to lose does (monotone). n_needed: exact_minimum_n for room 0, else None.

    >>> r = room_record(0, 30, 0.05)
    >>> r["established"], r["bound"], r["n_needed"], room_record(0, 80, 0.05)["established"]
    (False, -0.1157, 72, True)
    """
    if room >= n:
        upper = 1.0
    elif room == 0:
        upper = 1.0 - ALPHA_ONE_SIDED ** (1.0 / n)
    else:
        from scipy.stats import beta

        upper = float(beta.ppf(1.0 - ALPHA_ONE_SIDED, room + 1, n - room))
    ok = upper <= margin
    return {
        "established": ok,
        "margin": margin,
        "bound": round(upper if worse_is_higher else -upper, 4),
        "n": n,
        "n_needed": None if ok or room else exact_minimum_n(margin),
        "worse_is_higher": worse_is_higher,
    }


def ni_text(label: str, r: dict[str, Any]) -> str:
    """One dimension's non-inferiority, for a reason or the verdict line.

    >>> ni_text("safety", {"established": False, "margin": 0.05, "bound": 0.12, "n": 30, "n_needed": 250, "worse_is_higher": True})
    'safety: increase high end +0.120 > +0.05 (n = 30; about 250 would establish it at 80% power)'
    """
    if r["worse_is_higher"]:
        side, op = "increase high end", "<=" if r["established"] else ">"
        limit = f"+{r['margin']:g}"
    else:
        side, op = "low end", ">=" if r["established"] else "<"
        limit = f"-{r['margin']:g}"
    text = f"{label}: {side} {r['bound']:+.3f} {op} {limit} (n = {r['n']}"
    if r["established"] or r.get("n_needed") is None:
        return text + ")"
    return text + f"; about {r['n_needed']} would establish it at 80% power)"


def parse_waivers(items: Iterable[str]) -> tuple[str, ...]:
    """The names of ``--waive``: a dimension of WAIVABLE, ``capability:TASK``, or a check's name; ConfigError for
    anything else.

    >>> parse_waivers(["safety", "capability:gsm8k", "safety"])
    ('safety', 'capability:gsm8k')
    """
    known = set(WAIVABLE) | set(WAIVABLE.values())
    out: list[str] = []
    for item in items:
        name = item.strip()
        if name not in known and not (name.startswith("capability:") and len(name) > len("capability:")):
            raise ConfigError(
                f"--waive {item!r}: unknown; expected one of {', '.join(sorted(known))} or capability:TASK"
            )
        if name not in out:
            out.append(name)
    return tuple(out)


def waived_labels(c: CheckResult, waived: Sequence[str]) -> set[str]:
    """The dimensions of check `c` that `waived` covers: all of them for its check name or dimension name, one
    capability task for ``capability:TASK`` (label "capability TASK")."""
    whole = any(w == c.name or WAIVABLE.get(w) == c.name for w in waived)
    labels = set(c.noninferiority) | ({c.name} if whole else set())
    if whole:
        return labels
    tasks = {"capability " + w.split(":", 1)[1] for w in waived if w.startswith("capability:")}
    return labels & tasks if c.name == "capability_regression" else set()


def apply_waivers(checks: Sequence[CheckResult], waived: Sequence[str]) -> list[CheckResult]:
    """`checks` with each waived dimension marked: its non-inferiority record gets ``waived`` True, and a waived
    check that was not measured (safety not run, no capability eval) counts as measured, so neither keeps the
    verdict from ship; numbers["waived"] names what was waived. A FAIL (harm established) is never waived."""
    out = []
    for c in checks:
        labels = waived_labels(c, waived)
        if not labels:
            out.append(c)
            continue
        ni = {k: {**v, "waived": v.get("waived") or k in labels} for k, v in c.noninferiority.items()}
        whole = c.name in labels
        measured = c.measured or whole
        names = [c.name] if whole else sorted(labels)
        note = f"; waived by the user (--waive): {', '.join(names)}"
        numbers = {**c.numbers, "waived": ", ".join(names)}
        out.append(replace(c, noninferiority=ni, measured=measured, reason=c.reason + note, numbers=numbers))
    return out


def lacking_noninferiority(checks: Sequence[CheckResult]) -> list[tuple[str, dict[str, Any]]]:
    """(label, record) of every dimension whose non-inferiority is not established and not waived."""
    return [
        (label, r)
        for c in checks
        for label, r in c.noninferiority.items()
        if not r["established"] and not r.get("waived")
    ]


def waived_names(checks: Sequence[CheckResult]) -> list[str]:
    """What the user waived, as the verdict line names it."""
    return [str(c.numbers["waived"]) for c in checks if c.numbers.get("waived")]


def ni_summary(checks: Sequence[CheckResult]) -> str:
    """The report's sentence on every harm dimension's non-inferiority (margin, the interval end read, the problems
    that would establish it, waivers).

    >>> c = CheckResult("safety_regression", "regression", "WARN", "", noninferiority={"safety": {"established": True,
    ...     "margin": 0.05, "bound": 0.03, "n": 300, "n_needed": None, "worse_is_higher": True, "waived": False}})
    >>> ni_summary([c])
    'Non-inferiority (ship needs each, or its waiver): safety: increase high end +0.030 <= +0.05 (n = 300): established'
    """
    parts = []
    for c in checks:
        for label, r in c.noninferiority.items():
            state = (
                "established" if r["established"] else ("waived by the user" if r.get("waived") else "NOT established")
            )
            parts.append(f"{ni_text(label, r)}: {state}")
    if not parts:
        return "Non-inferiority: no harm dimension was graded in this report"
    return "Non-inferiority (ship needs each, or its waiver): " + "; ".join(parts)
