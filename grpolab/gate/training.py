"""Release checks on the training metric history (pure functions on plain dicts and lists).

Every check returns a :class:`CheckResult`: PASS / WARN / FAIL, or N/A when it cannot fail in the run's
configuration (the reason says which setting makes it so; N/A never counts toward the verdict), with the
numbers it looked at and a one-line reason. FAIL is reserved for evidence that the model is worse, unsafe, or
that the evidence is invalid, read from an interval; the checks of this module read the training history, whose
numbers have no interval, so they WARN at most (reward_vs_heldout, which compares with the held-out interval,
can FAIL). A PASS reason states the condition that held, with its bound.
Rows are the objects of ``metrics.jsonl`` (``{"step": N, "reward/mean": ..., ...}``, non-finite values as None).
The run's resolved config (``manifest["config"]``) is passed explicitly; a field missing from an older
manifest is unknown, and nothing is declared N/A on a guess.

The checks read the unprefixed metric names. With dynamic sampling those describe the sampled batch (every
group generated in the step); the kept training batch, logged under ``kept/``, is never read
(:mod:`grpolab.gate.hacking` says why).

"Early" and "late" are the means of the first and the last ``window_frac`` of a metric's finite values
(at least one value each). A check that needs a trend WARNs "too few steps" below ``min_points`` values.
Thresholds live in :class:`Thresholds`; each check's docstring states its rule and default thresholds.
The reward-hacking checks live in :mod:`grpolab.gate.hacking`, the shared pieces in :mod:`grpolab.gate.base`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .base import (
    PASS,
    SEVERITY,
    WARN,
    CheckResult,
    early_late,
    grade,
    no_reference_model,
    not_applicable,
    not_measured,
    paired,
    r4,
    reward_weights,
    setting,
    single_step_on_policy,
    too_few,
    values,
)
from .hacking import check_format_vs_correct, check_reward_length_corr, check_reward_vs_heldout, transfer_comparison
from .thresholds import Thresholds

ONE_STEP = (
    "train.mu = 1 and train.minibatches = 1: the only optimizer step of each batch uses the policy that "
    "sampled it (pi_theta = pi_old)"
)


def _bound(value: float, warn: float, above: bool = True, fmt: str = "{:g}") -> str:
    """The bound `value` met under grade(value, warn, above), e.g. '>= 0.5' or '< 0.5' (above), '< x0.5' (below).

    >>> _bound(0.6, 0.5), _bound(0.4, 0.5), _bound(0.4, 0.5, above=False)
    ('>= 0.5', '< 0.5', '< 0.5')
    """
    w = fmt.format(warn)
    if above:
        return f">= {w}" if value >= warn else f"< {w}"
    return f"< {w}" if value < warn else f">= {w}"


def _over(value: float, warn: float, unit: str = "") -> tuple[str, str]:
    """(status, bound) for 'WARN above warn' (strict), e.g. ('PASS', '<= 0.1')."""
    return (WARN, f"> {warn:g}{unit}") if value > warn else (PASS, f"<= {warn:g}{unit}")


# ---------------------------------------------------------------- learning signal and dynamics
#
# Training-health checks: a number from the training history, with no interval, that predicts trouble but is no
# measurement of harm. Each only WARNs with its numbers (docs/report.md, "FAIL and WARN"); the harm they predict
# is measured on held-out problems (heldout_improvement, pass_at_k_diversity, capability_regression).


def check_learning_signal(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Learning signal: share of zero-variance groups (they carry no gradient), overall and per slice.

    Rule: late mean of groups/frac_zero_std (the sampled batch: with dynamic sampling the kept batch has almost
    none by construction): WARN at or above `zero_std_warn` (default 0.5); each groups/frac_zero_std/<slice> the
    same way. Fewer than `min_points` steps: N/A too little evidence. Training health: never FAIL.
    """
    name, group = "zero_variance_groups", "learning signal"
    overall = values(rows, "groups/frac_zero_std")
    if not overall:
        return not_measured(name, group, "no groups/frac_zero_std in metrics")
    if len(overall) < t.min_points:
        return too_few(name, group, "groups/frac_zero_std", len(overall), t)
    late = early_late(overall, t.window_frac)[1]
    status = grade(late, t.zero_std_warn)
    numbers: dict[str, Any] = {"late": r4(late), "mean": r4(sum(overall) / len(overall))}
    slice_keys = sorted({k for r in rows for k in r if k.startswith("groups/frac_zero_std/")})
    flagged = []
    for key in slice_keys:
        vals = values(rows, key)
        if not vals:
            continue
        s_late = early_late(vals, t.window_frac)[1]
        numbers[f"late/{key.rsplit('/', 1)[1]}"] = r4(s_late)
        if grade(s_late, t.zero_std_warn) != PASS:
            flagged.append(f"{key.rsplit('/', 1)[1]} {s_late:.2f}")
            status = WARN
    reason = f"late share of zero-variance groups {late:.2f} ({_bound(late, t.zero_std_warn)})"
    reason += ": most groups carry no learning signal" if late >= t.zero_std_warn else ""
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

    Rule: growth g = late/early: WARN above `length_ratio_warn` (default 1.5). Shrinking is what concise answers
    look like, so it only WARNs when early/late exceeds `length_shrink_warn` (default 3.0: a collapse to very
    short answers, read the samples). Training health: never FAIL.
    """
    name, group = "length_drift", "dynamics"
    bad, e, l = _ratio_check(rows, "completion/len_mean", name, group, t)
    if bad:
        return bad
    growth = l / e if e > 0 else (1.0 if l == 0 else math.inf)
    numbers = {"early": r4(e), "late": r4(l), "growth": r4(growth)}
    if growth > 0 and 1 / growth > t.length_shrink_warn:
        return CheckResult(
            name,
            group,
            WARN,
            f"mean completion length {e:.1f}->{l:.1f} tokens (x{growth:.2f} < "
            f"x{1 / t.length_shrink_warn:.2f}): collapsed to much shorter answers, read the samples",
            numbers,
        )
    status, bound = _over(growth, t.length_ratio_warn)
    bound = bound.replace("> ", "> x").replace("<= ", "<= x")
    if growth < 1:
        bound = f">= x{1 / t.length_shrink_warn:.2f}: shorter answers, not collapsed"
    return CheckResult(
        name, group, status, f"mean completion length {e:.1f}->{l:.1f} tokens (x{growth:.2f} {bound})", numbers
    )


def check_truncation_drift(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Truncation: completions of the sampled batch hitting max_new_tokens (answer cut off, reward computed on
    a fragment).

    Rule: WARN when late - early truncated share >= `trunc_rise_warn` (0.1) or late >= `trunc_level_warn` (0.2),
    and whenever the run's first steps cut most completions (``completion/max_new_tokens_to_try``, logged by
    grpolab.training.truncation at the step it warned: the reason names the value to try), however few steps.
    Training health: never FAIL (the held-out evaluation's own truncation share is in the held-out table).
    """
    name, group = "truncation_drift", "dynamics"
    first = next((r for r in rows if r.get("completion/max_new_tokens_to_try") is not None), None)
    early_cut = (
        f"the first steps cut {first['completion/first_steps_truncated_frac']:.0%} of the completions: try "
        f"rollout.max_new_tokens = {first['completion/max_new_tokens_to_try']:.0f} (truncation.json)"
        if first
        else ""
    )
    bad, e, l = _ratio_check(rows, "completion/truncated_frac", name, group, t)
    if bad:
        return CheckResult(name, group, WARN, f"{early_cut}; {bad.reason}", bad.numbers) if first else bad
    status = max(grade(l - e, t.trunc_rise_warn), grade(l, t.trunc_level_warn), key=SEVERITY.get)
    reason = (
        f"truncated share {e:.2f}->{l:.2f} (rise {l - e:+.2f} {_bound(l - e, t.trunc_rise_warn)}, "
        f"late {l:.2f} {_bound(l, t.trunc_level_warn)})"
    )
    if first:
        status, reason = WARN, f"{early_cut}; {reason}"
    return CheckResult(name, group, status, reason, {"early": r4(e), "late": r4(l)})


def check_entropy_collapse(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Entropy collapse: the policy stops exploring.

    Rule: WARN when late/early < `entropy_ratio_warn` (0.5) or late entropy < `entropy_floor` (0.02 nats/token).
    Training health: never FAIL. The harm a collapse predicts -- fewer distinct right answers when sampling -- is
    measured by pass_at_k_diversity (held-out pass@k, base vs trained).
    """
    name, group = "entropy_collapse", "dynamics"
    bad, e, l = _ratio_check(rows, "policy/entropy", name, group, t)
    if bad:
        return bad
    ratio = l / e if e > 0 else 1.0
    status = max(
        grade(ratio, t.entropy_ratio_warn, above=False), grade(l, t.entropy_floor, above=False), key=SEVERITY.get
    )
    reason = (
        f"entropy {e:.3f}->{l:.3f} nats/token (x{ratio:.2f} {_bound(ratio, t.entropy_ratio_warn, above=False, fmt='x{:g}')}, "
        f"late {_bound(l, t.entropy_floor, above=False)})"
    )
    if status == WARN:
        reason += "; its harm, if any, shows in pass_at_k_diversity"
    return CheckResult(name, group, status, reason, {"early": r4(e), "late": r4(l), "ratio": r4(ratio)})


def check_kl_blowup(rows: Sequence[dict[str, Any]], config: dict[str, Any] | None, t: Thresholds) -> CheckResult:
    """KL blow-up: the policy runs away from the reference, or moves too far within one update.

    Rule: WARN when max policy/kl > `kl_warn` (0.1) or max policy/approx_kl_old > `kl_old_warn` (0.05).
    The reference part is N/A when algorithm.beta == 0 (no reference model); the old-policy part is N/A when
    train.mu == 1 and train.minibatches == 1 (pi_theta == pi_old at the only optimizer step). Both N/A: the
    check is N/A. An applicable part without its metric: WARN "not measured"; with fewer than `min_points` steps of
    it: N/A too little evidence. Training health: never FAIL.
    """
    name, group = "kl_blowup", "dynamics"
    parts = [
        (
            "KL to reference",
            "policy/kl",
            t.kl_warn,
            "max_kl",
            no_reference_model(config) and "no reference model (algorithm.beta = 0)",
        ),
        (
            "KL to old policy",
            "policy/approx_kl_old",
            t.kl_old_warn,
            "max_approx_kl_old",
            single_step_on_policy(config) and ONE_STEP,
        ),
    ]
    na = [f"{label} N/A: {why}" for label, *_, why in parts if why]
    if len(na) == len(parts):
        return not_applicable(name, group, f"no reference model (algorithm.beta = 0), and {ONE_STEP}")
    status, said, numbers, missing = PASS, [], {}, []
    for label, key, warn, number, why in parts:
        if why:
            continue
        vals = values(rows, key)
        if not vals:
            missing.append(key)
            continue
        if len(vals) < t.min_points:
            return too_few(name, group, key, len(vals), t)
        top = max(vals)
        s, bound = _over(top, warn)
        status = max(status, s, key=SEVERITY.get)
        numbers[number] = r4(top)
        said.append(f"max {label} {top:.4f} nats/token ({bound})")
    if missing:
        said.insert(0, f"not measured: no {' or '.join(missing)}")
        return CheckResult(name, group, WARN, "; ".join(said + na), numbers, measured=False)
    return CheckResult(name, group, status, "; ".join(said + na), numbers)


def check_clip_blowup(rows: Sequence[dict[str, Any]], config: dict[str, Any] | None, t: Thresholds) -> CheckResult:
    """Clip-fraction blow-up: most tokens hit the trust region, the update is fighting the clip.

    Rule: c = max over steps of clip_frac_low + clip_frac_high; WARN above `clip_warn` (0.2). N/A when train.mu == 1
    and train.minibatches == 1: the ratio pi_theta / pi_old is 1 by construction (token and sequence ratios
    alike), so nothing is clipped. Fewer than `min_points` steps: N/A too little evidence. Training health: never FAIL.
    """
    name, group = "clip_blowup", "dynamics"
    if single_step_on_policy(config):
        return not_applicable(
            name,
            group,
            f"{ONE_STEP}, so the ratio pi_theta / pi_old (token or sequence) is 1 and nothing can be clipped",
        )
    lo, hi = paired(rows, "policy/clip_frac_low", "policy/clip_frac_high")
    if not lo:
        return not_measured(name, group, "no policy/clip_frac_low/high")
    if len(lo) < t.min_points:
        return too_few(name, group, "policy/clip_frac_low/high", len(lo), t)
    c = max(a + b for a, b in zip(lo, hi))
    status, bound = _over(c, t.clip_warn)
    return CheckResult(name, group, status, f"max clipped token share {c:.3f} ({bound})", {"max_clip_frac": r4(c)})


def check_sampler_mismatch(rows: Sequence[dict[str, Any]], t: Thresholds) -> CheckResult:
    """Sampler mismatch: sampler and trainer disagree on the sampled tokens' logprobs.

    Rule: late mean of sampler/logp_diff_mean: WARN above `logp_diff_warn` (0.1 nats/token). The largest token
    difference (max of sampler/logp_diff_max) is shown when logged. Fewer than `min_points` steps: N/A too little
    evidence. Training health: never FAIL.
    """
    name, group = "sampler_mismatch", "dynamics"
    vals = values(rows, "sampler/logp_diff_mean")
    if not vals:
        return not_measured(name, group, "no sampler/logp_diff_mean")
    if len(vals) < t.min_points:
        return too_few(name, group, "sampler/logp_diff_mean", len(vals), t)
    late = early_late(vals, t.window_frac)[1]
    token_max = values(rows, "sampler/logp_diff_max")
    status, bound = _over(late, t.logp_diff_warn)
    numbers = {"late_mean": r4(late)}
    if token_max:
        numbers["max"] = r4(max(token_max))
        most = f"largest token difference {max(token_max):.3f}"
    else:
        most = "largest token difference not logged (no finite sampler/logp_diff_max)"
    return CheckResult(
        name, group, status, f"late mean |logp sampler - logp trainer| {late:.4f} nats/token ({bound}; {most})", numbers
    )


def check_staleness(rows: Sequence[dict[str, Any]], config: dict[str, Any] | None, t: Thresholds) -> CheckResult:
    """Staleness (rollout.max_staleness = k > 0; grpolab.training.pipeline): how old the trained samples were.

    Rule: the share of steps (each trains on one batch of equal size, so of samples) whose async/staleness equals
    k: WARN above `staleness_bound_warn` (0.5), PASS otherwise. The fixed-lag schedule puts every step after the
    first k at the bound whenever the run is longer than 2k steps, so a WARN says "read the off-policy evidence",
    which the detail gives: the late mean of sampler/kl_k3 (behaviour vs current, per token) and the late share of
    tokens the correction truncated, masked or rejected. A synchronous run (k = 0, or no config): N/A.
    """
    name, group = "staleness", "dynamics"
    k = setting(config, "rollout.max_staleness")
    if not k:
        return not_applicable(name, group, "synchronous rollouts (rollout.max_staleness 0): every sample is on-policy")
    ages = values(rows, "async/staleness")
    if not ages:
        return not_measured(name, group, "no async/staleness")
    at_bound = sum(a >= k for a in ages) / len(ages)
    numbers: dict[str, Any] = {"max_staleness": k, "at_bound_frac": r4(at_bound), "max": max(ages)}
    detail = [f"{at_bound:.0%} of the samples were {k} update(s) old (the bound), mean {sum(ages) / len(ages):.2f}"]
    kl = values(rows, "sampler/kl_k3")
    if kl:
        numbers["late_kl_k3"] = r4(early_late(kl, t.window_frac)[1])
        detail.append(f"late behaviour-vs-current k3 KL {numbers['late_kl_k3']:.4f} nats/token")
    cut = [sum(r.get(f"sampler/token_{x}_frac", 0.0) for x in ("truncated", "masked", "rejected")) for r in rows]
    if any(cut):
        numbers["late_corrected_frac"] = r4(early_late(cut, t.window_frac)[1])
        detail.append(f"late share of tokens truncated, masked or rejected {numbers['late_corrected_frac']:.3f}")
    status, bound = _over(at_bound, t.staleness_bound_warn)
    return CheckResult(name, group, status, "; ".join(detail) + f" (share at the bound {bound})", numbers)


def training_checks(
    rows: Sequence[dict[str, Any]],
    config: dict[str, Any] | None,
    heldout: dict[str, Any] | None,
    t: Thresholds,
    diversity: dict[str, Any] | None = None,
) -> list[CheckResult]:
    """All checks on the metric history, in report order. `config` is the run's resolved config
    (manifest["config"]); a missing field is unknown. reward_vs_heldout reads hacking.transfer_comparison of the
    held-out comparison and the `diversity` evidence (pass@1 sampled at the training temperature)."""
    return [
        check_reward_vs_heldout(rows, transfer_comparison(heldout, diversity, config), t, reward_weights(config)),
        check_format_vs_correct(rows, reward_weights(config), t),
        check_reward_length_corr(rows, config, t),
        check_learning_signal(rows, t),
        check_length_drift(rows, t),
        check_truncation_drift(rows, t),
        check_entropy_collapse(rows, t),
        check_kl_blowup(rows, config, t),
        check_clip_blowup(rows, config, t),
        check_sampler_mismatch(rows, t),
        check_staleness(rows, config, t),
    ]
