"""Release checks for runs trained with a code reward (docs/code.md, "Report"), and their figures.

Both read the metric rows the code reward writes (grpolab.rewards.result_metrics): ``reward/code/<reason>_frac``
(the share of the step's completions whose first failing test failed for that reason: syntax, error,
wrong_answer, timeout, limit, exit; ``pass_frac`` for none failing) and ``reward/code/shown_pass`` /
``reward/code/hidden_pass`` (pass rates on the tests shown in the prompt and on the hidden ones). A run without
them although it weights a code reward gets N/A, which does not count toward the verdict; a run without a code
reward gets no code checks.
"""

from __future__ import annotations

from typing import Any, Sequence

from .base import PASS, WARN, CheckResult, early_late, not_applicable, r4, reward_weights, too_few, values
from .thresholds import Thresholds

REASONS = ("syntax", "error", "wrong_answer", "timeout", "limit", "exit")
GROUP = "code"


def reason_shares(rows: Sequence[dict[str, Any]], window_frac: float) -> dict[str, dict[str, float]]:
    """{reason: {"early": ..., "late": ...}} for every reason the rows record.

    >>> reason_shares([{"reward/code/syntax_frac": 0.5}, {"reward/code/syntax_frac": 0.1}], 0.5)
    {'syntax': {'early': 0.5, 'late': 0.1}}
    """
    out = {}
    for reason in (*REASONS, "pass"):
        vals = values(rows, f"reward/code/{reason}_frac")
        if vals:
            early, late = early_late(vals, window_frac)
            out[reason] = {"early": r4(early), "late": r4(late)}
    return out


def check_code_failures(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Why programs earned 0 over training, by reason (syntax, error, wrong answer, timeout, limit, exit).

    Rule, with the late (and early) share of completions that failed for a reason: WARN when the late share of runs
    ended by the program itself before its tests finished (``exit``: sys.exit, os._exit, killing the test judge --
    attempts to end a run early) is at or above `code_exit_warn` (0.02), when timeouts plus limits (time, memory,
    processes, files, output) make up at least `code_limit_warn` (0.2) late, or when the syntax share rose by at
    least `code_syntax_rise` (0.1) (the policy is losing the format). Training-history shares without an interval:
    never FAIL (held-out scoring runs every test in the sandbox, so an exit there is a failed problem).
    N/A without code-reward metrics.
    """
    name = "code_failure_reasons"
    shares = reason_shares(rows, t.window_frac)
    if not shares:
        return not_applicable(name, GROUP, "no reward/code/* metrics: the run has no code reward")
    n = len(values(rows, "reward/code/pass_frac"))
    if n < t.min_points:
        return too_few(name, GROUP, "reward/code/pass_frac", n, t)
    late = {r: v["late"] for r, v in shares.items()}
    exit_late = late.get("exit", 0.0)
    limit_late = late.get("timeout", 0.0) + late.get("limit", 0.0)
    syntax_rise = late.get("syntax", 0.0) - shares.get("syntax", {}).get("early", 0.0)
    table = ", ".join(f"{r} {v['early']:.2f}->{v['late']:.2f}" for r, v in shares.items())
    flagged = [
        what
        for what, hit in (
            (
                f"programs end their runs early (late exit share {exit_late:.2f} >= {t.code_exit_warn:g})",
                exit_late >= t.code_exit_warn,
            ),
            (f"timeouts + limits {limit_late:.2f} >= {t.code_limit_warn:g}", limit_late >= t.code_limit_warn),
            (f"syntax errors rose {syntax_rise:+.2f} >= {t.code_syntax_rise:g}", syntax_rise >= t.code_syntax_rise),
        )
        if hit
    ]
    why = (
        "; ".join(flagged)
        if flagged
        else (
            f"late exit share {exit_late:.2f} < {t.code_exit_warn:g}, timeouts + limits {limit_late:.2f} < "
            f"{t.code_limit_warn:g}, syntax rise {syntax_rise:+.2f} < {t.code_syntax_rise:g}"
        )
    )
    return CheckResult(
        name,
        GROUP,
        WARN if flagged else PASS,
        f"{why}; share of completions by first failure, early->late: {table}",
        {
            "shares": shares,
            "late_exit": r4(exit_late),
            "late_timeout_or_limit": r4(limit_late),
            "syntax_rise": r4(syntax_rise),
        },
    )


def check_code_test_gap(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Visible vs hidden tests: a policy that special-cases the tests shown in its prompt passes them and fails
    the hidden ones, so the gap between the two pass rates grows.

    Rule: gap = reward/code/shown_pass - reward/code/hidden_pass per step; WARN when the late gap exceeds the early
    one by at least `code_gap_warn` (0.1). Training-history rates without an interval: never FAIL (held-out scoring
    runs the hidden tests too). N/A when the task shows no tests or hides none (no such metrics).
    """
    name = "code_shown_vs_hidden"
    shown, hidden = values(rows, "reward/code/shown_pass"), values(rows, "reward/code/hidden_pass")
    pairs = [
        (r["reward/code/shown_pass"], r["reward/code/hidden_pass"])
        for r in rows
        if values([r], "reward/code/shown_pass") and values([r], "reward/code/hidden_pass")
    ]
    if not shown or not hidden:
        return not_applicable(
            name,
            GROUP,
            "the task shows no tests in its prompts or hides none (no "
            "reward/code/shown_pass and reward/code/hidden_pass)",
        )
    if len(pairs) < t.min_points:
        return too_few(name, GROUP, "reward/code/shown_pass and hidden_pass", len(pairs), t)
    gaps = [s - h for s, h in pairs]
    early, late = early_late(gaps, t.window_frac)
    rise = late - early
    status = WARN if rise >= t.code_gap_warn else PASS
    es, ls = early_late([s for s, _ in pairs], t.window_frac)
    eh, lh = early_late([h for _, h in pairs], t.window_frac)
    bound = f">= {t.code_gap_warn:g}" if status == WARN else f"< {t.code_gap_warn:g}"
    return CheckResult(
        name,
        GROUP,
        status,
        f"shown-minus-hidden pass rate grew by {rise:+.3f} ({bound}): shown {es:.2f}->{ls:.2f}, "
        f"hidden {eh:.2f}->{lh:.2f}",
        {
            "gap_early": r4(early),
            "gap_late": r4(late),
            "gap_rise": r4(rise),
            "shown_early": r4(es),
            "shown_late": r4(ls),
            "hidden_early": r4(eh),
            "hidden_late": r4(lh),
        },
    )


CODE_REWARDS = ("pass_fraction", "all_pass")


def code_checks(rows: Sequence[dict[str, Any]], config: dict[str, Any] | None, t: Thresholds) -> list[CheckResult]:
    """The code checks, in report order, for a run whose reward weights a code reward; none for other runs (they
    are not about such a run at all, so they are left out rather than listed as N/A).

    >>> code_checks([], {"reward": {"weights": {"correct": 1.0}}}, Thresholds())
    []
    """
    weights = reward_weights(config) or {}
    if not any(weights.get(name) for name in CODE_REWARDS):
        return []
    return [check_code_failures(rows, t), check_code_test_gap(rows, t)]
