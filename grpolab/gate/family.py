"""The family-wise control of the FAIL rules: Holm's step-down procedure over every one-sided test of harm in a
report, the tests that cannot be rejected at all ("cannot fail"), and the report's sentence on the error rate."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from .base import FAIL, NA, WARN, CheckResult

PER_TEST_ALPHA = 0.025  # one-sided level of a single FAIL rule: its 95% interval lies beyond the bound


def holm_rejections(p_values: Sequence[float], alpha: float, cap: float = PER_TEST_ALPHA) -> list[bool]:
    """Holm's step-down procedure: sort the m p-values, p_(1) <= ... <= p_(m); reject H_(i) while p_(i) <=
    min(cap, alpha / (m - i + 1)), and stop at the first that is not. The family-wise error rate (the chance of
    rejecting any true null) is at most alpha for any dependence between the tests; the cap keeps each test at least
    as strict as its own rule (a 95% interval: one-sided 2.5%), which only removes rejections.

    >>> holm_rejections([0.001, 0.03, 0.02], 0.05)
    [True, False, True]
    >>> holm_rejections([0.02, 0.02, 0.02], 0.05)
    [False, False, False]
    >>> holm_rejections([0.02], 0.05)
    [True]
    """
    m, order = len(p_values), sorted(range(len(p_values)), key=lambda i: p_values[i])
    reject = [False] * m
    for rank, i in enumerate(order):
        if p_values[i] > min(cap, alpha / (m - rank)):
            break
        reject[i] = True
    return reject


def attainable_tests(
    tests: Sequence[tuple[str, str, float, bool, float]], alpha: float, cap: float = PER_TEST_ALPHA
) -> tuple[list[int], set[str]]:
    """(indices of the tests that can reject, names of the checks left without one).

    A test (check name, label, p, fails, min_p) whose smallest attainable p-value min_p (stats.smallest_p_value: 2^-k
    for the exact sign test when the base has only k items it can lose) exceeds min(cap, alpha / m), m the number of
    tests left in the family, can never be rejected by Holm (holm_rejections): its check "cannot fail". Removing it
    shrinks m, so the rule is applied until no test is removed. A check all of whose tests are removed is named.

    >>> attainable_tests([("a", "x", 0.5, False, 2 ** -5), ("b", "y", 0.5, False, 2 ** -9)], 0.05)
    ([1], {'a'})
    >>> six = [("c", "z", 0.5, False, 2 ** -6), ("d", "w", 0.5, False, 0.0)]   # 2^-6 = 0.0156
    >>> attainable_tests(six + [("e", "v", 0.5, False, 0.0)], 0.05)   # m = 3: 0.0156 <= 0.05 / 3
    ([0, 1, 2], set())
    >>> attainable_tests(six + [("e", "v", 0.5, False, 0.0)] * 2, 0.05)   # m = 4: 0.0156 > 0.0125, then m = 3
    ([1, 2, 3], {'c'})
    """
    keep = list(range(len(tests)))
    while True:
        limit = min(cap, alpha / max(1, len(keep)))
        left = [i for i in keep if tests[i][4] <= limit]
        if len(left) == len(keep):
            break
        keep = left
    names = {tests[i][0] for i in range(len(tests))} - {tests[i][0] for i in keep}
    return keep, names


def cannot_fail(c: CheckResult, m: int, alpha: float) -> CheckResult:
    """N/A "cannot fail": no fail test of `c` could be rejected among the `m` tests of this report's family. Its
    non-inferiority record stays: a check that cannot fail has not shown the trained model no worse, so the verdict
    still needs it (or its waiver) -- a base with few items right blocks ship as one with more does (monotone)."""
    smallest = min(float(v.get("min_p", 0.0)) for v in c.fail_tests.values())
    level = min(PER_TEST_ALPHA, alpha / max(1, m))
    return replace(
        c,
        status=NA,
        measured=True,
        fail_tests={},
        reason=f"cannot fail: even the worst case (every item the base can lose, lost) "
        f"gives p = {smallest:.3g} by the exact sign test, above {level:.3g}"
        f" (Holm's first step over the {m} FAIL rules of this report), so no harm could be established; "
        f"was: {c.status} {c.reason}",
    )


def family_control(checks: Sequence[CheckResult], alpha: float) -> list[CheckResult]:
    """`checks` under the family-wise control of their FAIL rules (Holm's procedure, holm_rejections).

    1. Tests that cannot be rejected at Holm's first step (attainable_tests: their smallest attainable p is above
       min(0.025, alpha / m)) leave the family; a regression check left with none is N/A "cannot fail" (it cannot
       FAIL, but its non-inferiority record stays, so it blocks ship as any unshown dimension does) -- unless its own 95% rule FAILed, which step 2 treats as unresolved harm. (Such a test could
       be rejected only after every smaller p-value was, when the verdict is "don't ship" already.)
       heldout_improvement keeps its grade (its FAIL rule is not what it PASSes on).
    2. A FAIL stays only where Holm over the remaining tests rejects "no harm" for a test whose own rule FAILed. A
       FAIL that Holm does not keep becomes WARN with numbers["harm_unresolved"] True: its own 95% rule saw harm
       that the family-wise test does not confirm, so it is no FAIL and does not by itself block the verdict (nor
       `--strict`); what blocks is the rest of the gate: a harm dimension whose non-inferiority is not established
       (gate/noninferiority.py; a Holm-dropped drop is rarely non-inferior) keeps the verdict "not established"
       unless the user waived it.

    With every model truly unharmed, the chance of any FAIL is at most `alpha` (family-wise) among the tests in the
    family. Each check with fail tests gets numbers["p_harm"] (its smallest p-value)."""
    tests = [
        (c.name, label, float(v["p"]), bool(v["fails"]), float(v.get("min_p", 0.0)))
        for c in checks
        for label, v in c.fail_tests.items()
    ]
    keep, unattainable = attainable_tests(tests, alpha)
    unattainable.discard("heldout_improvement")
    family = [tests[i] for i in keep]
    rejected = holm_rejections([p for _, _, p, _, _ in family], alpha)
    kept = {(name, label) for (name, label, _, fails, _), r in zip(family, rejected) if r and fails}
    m, out = len(family), []
    for c in checks:
        if not c.fail_tests:
            out.append(c)
            continue
        if c.name in unattainable and c.status != FAIL:
            out.append(cannot_fail(c, m, alpha))
            continue
        p_min = min(float(v["p"]) for v in c.fail_tests.values())
        numbers = {**c.numbers, "p_harm": float(f"{p_min:.3g}")}
        if c.status == FAIL and not any((c.name, label) in kept for label in c.fail_tests):
            why = (
                f"; not a FAIL: p = {p_min:.3g} does not pass Holm's correction over the {m} FAIL rules of this report "
                f"(family-wise false-FAIL rate {alpha:g}), so the harm its own 95% rule saw is unresolved"
            )
            out.append(replace(c, status=WARN, reason=c.reason + why, numbers={**numbers, "harm_unresolved": True}))
        else:
            out.append(replace(c, numbers=numbers))
    return out


def family_statement(checks: Sequence[CheckResult], alpha: float) -> str:
    """One sentence on the FAIL rules' error rate, for the report.

    >>> family_statement([CheckResult("a", "g", "PASS", "", fail_tests={"x": {"p": 0.5, "fails": False}})], 0.05)
    "FAIL rules: 1 one-sided test (x), Holm's step-down at a family-wise false-FAIL rate of 0.05 (each test also at its own one-sided 0.025)"
    """
    labels = [label for c in checks for label in c.fail_tests]
    if not labels:
        return "FAIL rules: none applied in this report"
    return (
        f"FAIL rules: {len(labels)} one-sided test{'s' if len(labels) > 1 else ''} ({', '.join(labels)}), Holm's "
        f"step-down at a family-wise false-FAIL rate of {alpha:g} (each test also at its own one-sided "
        f"{PER_TEST_ALPHA:g})"
    )
