"""Release checks of code runs: failure reasons over training and the shown-vs-hidden test gap (pure functions on
metric rows), N/A for runs without a code reward, and their figures."""

from __future__ import annotations

from grpolab.gate.base import NA, PASS, WARN
from grpolab.gate.code import check_code_failures, check_code_test_gap, code_checks, reason_shares
from grpolab.gate.thresholds import Thresholds
from grpolab.report.plots import code_figures

T = Thresholds()


def rows(n: int = 10, **series) -> list[dict]:
    """n metric rows; each keyword is a metric suffix under reward/code/ with a (start, end) linear ramp."""
    out = []
    for i in range(n):
        row = {"step": i + 1}
        for key, (a, b) in series.items():
            row[f"reward/code/{key}"] = a + (b - a) * i / (n - 1)
        out.append(row)
    return out


def test_not_applicable_without_code_metrics():
    plain = [{"step": i, "reward/mean": 0.5} for i in range(10)]
    code_run = {"reward": {"weights": {"pass_fraction": 1.0}}}
    assert [c.status for c in code_checks(plain, code_run, T)] == [NA, NA]  # a code run that logged nothing
    assert code_checks(plain, {"reward": {"weights": {"correct": 1.0, "pass_fraction": 0.0}}}, T) == []
    assert code_figures(plain) == []


def test_failure_reasons_pass_and_warn():
    healthy = rows(
        pass_frac=(0.3, 0.6),
        wrong_answer_frac=(0.5, 0.3),
        syntax_frac=(0.2, 0.1),
        exit_frac=(0, 0),
        timeout_frac=(0, 0.01),
        limit_frac=(0, 0),
    )
    c = check_code_failures(healthy, T)
    assert c.status == PASS and "syntax 0.19->0.11" in c.reason
    assert check_code_failures(rows(pass_frac=(0.3, 0.3), syntax_frac=(0.1, 0.3)), T).status == WARN
    assert check_code_failures(rows(pass_frac=(0.3, 0.3), exit_frac=(0.0, 0.04)), T).status == WARN
    hacking = check_code_failures(rows(pass_frac=(0.3, 0.3), exit_frac=(0.0, 0.3)), T)
    assert hacking.status == WARN and hacking.numbers["late_exit"] > 0.1 and "end their runs early" in hacking.reason
    looping = check_code_failures(rows(pass_frac=(0.3, 0.1), timeout_frac=(0.1, 0.5), limit_frac=(0.0, 0.2)), T)
    assert looping.status == WARN and "timeouts + limits" in looping.reason  # training history: WARN, never FAIL
    assert check_code_failures(rows(n=2, pass_frac=(0.3, 0.3)), T).measured is False  # too few steps


def test_shown_vs_hidden_gap():
    honest = rows(shown_pass=(0.4, 0.7), hidden_pass=(0.35, 0.65))
    assert check_code_test_gap(honest, T).status == PASS
    special_casing = rows(shown_pass=(0.4, 0.95), hidden_pass=(0.35, 0.4))
    c = check_code_test_gap(special_casing, T)
    assert c.status == WARN and c.numbers["gap_rise"] >= 0.2
    assert check_code_test_gap(rows(shown_pass=(0.4, 0.6), hidden_pass=(0.4, 0.45)), T).status == WARN
    assert check_code_test_gap(rows(hidden_pass=(0.4, 0.6)), T).status == NA  # no shown tests (HumanEval)


def test_reason_shares_and_figures():
    r = rows(pass_frac=(0.2, 0.6), syntax_frac=(0.4, 0.1), shown_pass=(0.2, 0.6), hidden_pass=(0.2, 0.5))
    shares = reason_shares(r, 0.2)
    assert shares["syntax"]["early"] > shares["syntax"]["late"]
    titles = [t for t, png in code_figures(r) if png]
    assert titles == ["Code: share of completions by first failing reason", "Code: pass rate on shown vs hidden tests"]
