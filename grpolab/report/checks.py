"""Release checks on the training metric history (pure functions on plain dicts and lists).

Every check returns a :class:`CheckResult`: PASS / WARN / FAIL, or N/A when it cannot fail in the run's
configuration (the reason says which setting makes it so; N/A never counts toward the verdict), with the
numbers it looked at and a one-line reason. A PASS reason states the condition that held, with its bound.
Rows are the objects of ``metrics.jsonl`` (``{"step": N, "reward/mean": ..., ...}``, non-finite values as None).
The run's resolved config (``manifest["config"]``) is passed explicitly; a field missing from an older
manifest is unknown, and nothing is declared N/A on a guess.

The checks read the unprefixed metric names. With dynamic sampling those describe the sampled batch (every
group generated in the step); the kept training batch, logged under ``kept/``, is never read
(:mod:`grpolab.report.hacking` says why).

"Early" and "late" are the means of the first and the last ``window_frac`` of a metric's finite values
(at least one value each). A check that needs a trend WARNs "too few steps" below ``min_points`` values.
Thresholds live in :class:`Thresholds`; each check's docstring states its rule and default thresholds.
The reward-hacking checks live in :mod:`grpolab.report.hacking`, the shared pieces in :mod:`grpolab.report.base`;
both are re-exported here.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .base import (FAIL, NA, PASS, SEVERITY, STATUSES, WARN, CheckResult, Thresholds, early_late, grade,
                   no_reference_model, not_applicable, not_measured, paired, parse_thresholds, pearson, r4, reward_weights,
                   setting, single_step_on_policy, too_few, values)
from .hacking import check_format_vs_correct, check_reward_length_corr, check_reward_vs_heldout

__all__ = [
    "FAIL", "NA", "PASS", "SEVERITY", "STATUSES", "WARN", "CheckResult", "Thresholds", "check_clip_blowup",
    "check_entropy_collapse", "check_format_vs_correct", "check_kl_blowup", "check_learning_signal",
    "check_length_drift", "check_reward_length_corr", "check_reward_vs_heldout", "check_sampler_mismatch",
    "check_truncation_drift", "early_late", "paired", "parse_thresholds", "pearson", "setting", "training_checks",
    "values",
]

ONE_STEP = ("train.mu = 1 and train.minibatches = 1: the only optimizer step of each batch uses the policy that "
            "sampled it (pi_theta = pi_old)")


def _above(value: float, warn: float, fail: float, fmt: str = "{:g}") -> str:
    """The bound `value` met under grade(value, warn, fail) (inclusive above), e.g. '>= 0.25' or '< 0.1'.

    >>> _above(0.3, 0.1, 0.25), _above(0.05, 0.1, 0.25)
    ('>= 0.25', '< 0.1')
    """
    return f">= {fmt.format(fail)}" if value >= fail else f">= {fmt.format(warn)}" if value >= warn else f"< {fmt.format(warn)}"


def _over(value: float, warn: float, fail: float, unit: str = "") -> tuple[str, str]:
    """(status, bound) for 'FAIL above fail, WARN above warn' (strict), e.g. ('PASS', '<= 0.1')."""
    if value > fail:
        return FAIL, f"> {fail:g}{unit}"
    if value > warn:
        return WARN, f"> {warn:g}{unit}"
    return PASS, f"<= {warn:g}{unit}"


# ---------------------------------------------------------------- learning signal and dynamics


def check_learning_signal(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Learning signal: share of zero-variance groups (they carry no gradient), overall and per slice.

    Rule: late mean of groups/frac_zero_std (the sampled batch: with dynamic sampling the kept batch has almost
    none by construction): FAIL at or above `zero_std_fail` (default 0.9), WARN at or above `zero_std_warn`
    (default 0.5). Each groups/frac_zero_std/<slice> is graded the same way but can only WARN (a solved easy
    slice legitimately stops carrying signal).
    """
    name, group = "zero_variance_groups", "learning signal"
    overall = values(rows, "groups/frac_zero_std")
    if not overall:
        return not_measured(name, group, "no groups/frac_zero_std in metrics")
    late = early_late(overall, t.window_frac)[1]
    status = grade(late, t.zero_std_warn, t.zero_std_fail)
    numbers: dict[str, Any] = {"late": r4(late), "mean": r4(sum(overall) / len(overall))}
    slice_keys = sorted({k for r in rows for k in r if k.startswith("groups/frac_zero_std/")})
    flagged = []
    for key in slice_keys:
        vals = values(rows, key)
        if not vals:
            continue
        s_late = early_late(vals, t.window_frac)[1]
        numbers[f"late/{key.rsplit('/', 1)[1]}"] = r4(s_late)
        if grade(s_late, t.zero_std_warn, t.zero_std_fail) != PASS:
            flagged.append(f"{key.rsplit('/', 1)[1]} {s_late:.2f}")
            status = max(status, WARN, key=SEVERITY.get)
    reason = f"late share of zero-variance groups {late:.2f} ({_above(late, t.zero_std_warn, t.zero_std_fail)})"
    reason += {FAIL: ": almost no group carries a learning signal", WARN: ": most groups carry no signal",
               PASS: ""}[grade(late, t.zero_std_warn, t.zero_std_fail)]
    if flagged:
        reason += f"; slices without signal (>= {t.zero_std_warn:g}): {', '.join(flagged)}"
    return CheckResult(name, group, status, reason, numbers)


def _ratio_check(rows, key: str, name: str, group: str, t: Thresholds) -> tuple[CheckResult | None, float, float]:
    vals = values(rows, key)
    if len(vals) < t.min_points:
        return too_few(name, group, key, len(vals), t), 0.0, 0.0
    e, l = early_late(vals, t.window_frac)
    return None, e, l


def check_length_drift(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Length drift: late / early mean completion length (tokens) of the sampled batch.

    Rule: growth g = late/early: FAIL above `length_ratio_fail` (default 3.0), WARN above `length_ratio_warn`
    (default 1.5). Shrinking is what concise answers look like, so it only WARNs when early/late exceeds
    `length_ratio_fail` (a collapse to very short answers: read the samples).
    """
    name, group = "length_drift", "dynamics"
    bad, e, l = _ratio_check(rows, "completion/len_mean", name, group, t)
    if bad:
        return bad
    growth = l / e if e > 0 else (1.0 if l == 0 else math.inf)
    status, bound = _over(growth, t.length_ratio_warn, t.length_ratio_fail)
    bound = bound.replace("> ", "> x").replace("<= ", "<= x")
    if growth < 1:
        bound = f">= x{1 / t.length_ratio_fail:.2f}: shorter answers, not collapsed"
    reason = f"mean completion length {e:.1f}->{l:.1f} tokens (x{growth:.2f} {bound})"
    if growth > 0 and 1 / growth > t.length_ratio_fail:
        status = WARN
        reason = (f"mean completion length {e:.1f}->{l:.1f} tokens (x{growth:.2f} < x{1 / t.length_ratio_fail:.2f}): "
                  "collapsed to much shorter answers, read the samples")
    return CheckResult(name, group, status, reason, {"early": r4(e), "late": r4(l), "growth": r4(growth)})


def check_truncation_drift(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Truncation: completions of the sampled batch hitting max_new_tokens (answer cut off, reward computed on
    a fragment).

    Rule: FAIL when late - early truncated share >= `trunc_rise_fail` (0.25) or late >= `trunc_level_fail`
    (0.5); WARN when the rise >= `trunc_rise_warn` (0.1) or late >= `trunc_level_warn` (0.2).
    """
    name, group = "truncation_drift", "dynamics"
    bad, e, l = _ratio_check(rows, "completion/truncated_frac", name, group, t)
    if bad:
        return bad
    status = max(grade(l - e, t.trunc_rise_warn, t.trunc_rise_fail), grade(l, t.trunc_level_warn, t.trunc_level_fail),
                 key=SEVERITY.get)
    reason = (f"truncated share {e:.2f}->{l:.2f} (rise {l - e:+.2f} {_above(l - e, t.trunc_rise_warn, t.trunc_rise_fail)}, "
              f"late {l:.2f} {_above(l, t.trunc_level_warn, t.trunc_level_fail)})")
    return CheckResult(name, group, status, reason, {"early": r4(e), "late": r4(l)})


def check_entropy_collapse(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Entropy collapse: the policy stops exploring.

    Rule: FAIL when late entropy < `entropy_floor` (0.02 nats/token) or late/early < `entropy_ratio_fail`
    (0.2); WARN when late/early < `entropy_ratio_warn` (0.5).
    """
    name, group = "entropy_collapse", "dynamics"
    bad, e, l = _ratio_check(rows, "policy/entropy", name, group, t)
    if bad:
        return bad
    ratio = l / e if e > 0 else 1.0
    by_ratio = grade(ratio, t.entropy_ratio_warn, t.entropy_ratio_fail, above=False)
    status = FAIL if l < t.entropy_floor else by_ratio
    ratio_bound = {FAIL: f"< x{t.entropy_ratio_fail:g}", WARN: f"< x{t.entropy_ratio_warn:g}",
                   PASS: f">= x{t.entropy_ratio_warn:g}"}[by_ratio]
    floor_bound = f"< {t.entropy_floor:g}" if l < t.entropy_floor else f">= {t.entropy_floor:g}"
    return CheckResult(name, group, status, f"entropy {e:.3f}->{l:.3f} nats/token (x{ratio:.2f} {ratio_bound}, late "
                       f"{floor_bound})", {"early": r4(e), "late": r4(l), "ratio": r4(ratio)})


def check_kl_blowup(rows: Sequence[dict[str, Any]], config: dict[str, Any] | None, t: Thresholds) -> CheckResult:
    """KL blow-up: the policy runs away from the reference, or moves too far within one update.

    Rule: max policy/kl: FAIL above `kl_fail` (1.0), WARN above `kl_warn` (0.1); max policy/approx_kl_old:
    FAIL above `kl_old_fail` (0.5), WARN above `kl_old_warn` (0.05). The worse of the graded parts counts.
    The reference part is N/A when algorithm.beta == 0 (no reference model); the old-policy part is N/A when
    train.mu == 1 and train.minibatches == 1 (pi_theta == pi_old at the only optimizer step). Both N/A: the
    check is N/A. An applicable part without its metric: WARN "not measured".
    """
    name, group = "kl_blowup", "dynamics"
    parts = [("KL to reference", "policy/kl", t.kl_warn, t.kl_fail, "max_kl",
              no_reference_model(config) and "no reference model (algorithm.beta = 0)"),
             ("KL to old policy", "policy/approx_kl_old", t.kl_old_warn, t.kl_old_fail, "max_approx_kl_old",
              single_step_on_policy(config) and ONE_STEP)]
    na = [f"{label} N/A: {why}" for label, *_, why in parts if why]
    if len(na) == len(parts):
        return not_applicable(name, group, f"no reference model (algorithm.beta = 0), and {ONE_STEP}")
    status, said, numbers, missing = PASS, [], {}, []
    for label, key, warn, fail, number, why in parts:
        if why:
            continue
        vals = values(rows, key)
        if not vals:
            missing.append(key)
            continue
        top = max(vals)
        s, bound = _over(top, warn, fail)
        status = max(status, s, key=SEVERITY.get)
        numbers[number] = r4(top)
        said.append(f"max {label} {top:.4f} nats/token ({bound})")
    if missing:
        said.insert(0, f"not measured: no {' or '.join(missing)}")
        return CheckResult(name, group, max(status, WARN, key=SEVERITY.get), "; ".join(said + na), numbers,
                           measured=False)
    return CheckResult(name, group, status, "; ".join(said + na), numbers)


def check_clip_blowup(rows: Sequence[dict[str, Any]], config: dict[str, Any] | None, t: Thresholds) -> CheckResult:
    """Clip-fraction blow-up: most tokens hit the trust region, the update is fighting the clip.

    Rule: c = max over steps of clip_frac_low + clip_frac_high; FAIL above `clip_fail` (0.5), WARN above
    `clip_warn` (0.2). N/A when train.mu == 1 and train.minibatches == 1: the ratio pi_theta / pi_old is 1
    by construction (token and sequence ratios alike), so nothing is clipped.
    """
    name, group = "clip_blowup", "dynamics"
    if single_step_on_policy(config):
        return not_applicable(name, group, f"{ONE_STEP}, so the ratio pi_theta / pi_old (token or sequence) is 1 "
                              "and nothing can be clipped")
    lo, hi = paired(rows, "policy/clip_frac_low", "policy/clip_frac_high")
    if not lo:
        return not_measured(name, group, "no policy/clip_frac_low/high")
    c = max(a + b for a, b in zip(lo, hi))
    status, bound = _over(c, t.clip_warn, t.clip_fail)
    return CheckResult(name, group, status, f"max clipped token share {c:.3f} ({bound})", {"max_clip_frac": r4(c)})


def check_sampler_mismatch(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Sampler mismatch: sampler and trainer disagree on the sampled tokens' logprobs.

    Rule: late mean of sampler/logp_diff_mean: FAIL above `logp_diff_fail` (0.5 nats/token), WARN above
    `logp_diff_warn` (0.1).
    """
    name, group = "sampler_mismatch", "dynamics"
    vals = values(rows, "sampler/logp_diff_mean")
    if not vals:
        return not_measured(name, group, "no sampler/logp_diff_mean")
    late = early_late(vals, t.window_frac)[1]
    mx = max(values(rows, "sampler/logp_diff_max"), default=math.nan)
    status, bound = _over(late, t.logp_diff_warn, t.logp_diff_fail)
    return CheckResult(name, group, status, f"late mean |logp sampler - logp trainer| {late:.4f} nats/token "
                       f"({bound}; max token {mx:.3f})", {"late_mean": r4(late), "max": r4(mx)})


def training_checks(rows: Sequence[dict[str, Any]], config: dict[str, Any] | None, heldout: dict[str, Any] | None,
                    t: Thresholds) -> list[CheckResult]:
    """All checks on the metric history, in report order. `config` is the run's resolved config
    (manifest["config"]); a missing field is unknown."""
    return [
        check_reward_vs_heldout(rows, heldout, t), check_format_vs_correct(rows, reward_weights(config), t),
        check_reward_length_corr(rows, config, t), check_learning_signal(rows, t), check_length_drift(rows, t),
        check_truncation_drift(rows, t), check_entropy_collapse(rows, t), check_kl_blowup(rows, config, t),
        check_clip_blowup(rows, config, t), check_sampler_mismatch(rows, t),
    ]
