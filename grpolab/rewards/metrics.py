"""Per-step metrics of a batch's reward results: log-only failures, code outcomes, per-sample extras."""

from __future__ import annotations

from collections import Counter
from math import isfinite
from typing import Sequence

from grpolab.rewards.reward_set import RewardResult
from grpolab.sandbox import REASONS


def result_metrics(results: Sequence[RewardResult]) -> dict[str, float]:
    """Metrics of the reasons, extras and log-only failures of a batch's rewards (empty when there are none, e.g.
    math rewards, all weighted).

    - ``reward/<name>/failed_frac`` for every log-only reward (weight 0): the share of the completions it failed on
      (a failure of a weighted reward makes the sample invalid: ``reward/invalid_frac``);
    - ``reward/code/<reason>_frac`` for every reason (syntax, error, wrong_answer, timeout, limit, exit) and
      ``reward/code/pass_frac`` (no failing test): the share of the batch's completions, invalid ones included in
      the denominator;
    - ``reward/<extra>`` (``reward/code/shown_pass``, ``reward/code/hidden_pass``, ``reward/code/run_s``): the mean
      over the completions that have a finite value.

    >>> ok, bad = RewardResult(1.0, reason=None, extras={"code/run_s": 0.1}), RewardResult(0.0, reason="syntax")
    >>> result_metrics([ok, bad])["reward/code/syntax_frac"], result_metrics([ok, bad])["reward/code/pass_frac"]
    (0.5, 0.5)
    """
    n = len(results)
    log_only = sorted({name for r in results for name in r.log_only})
    failed = {f"reward/{name}/failed_frac": sum(name in r.failures for r in results) / n for name in log_only}
    coded = [r for r in results if r.reason is not None or any(k.startswith("code/") for k in r.extras)]
    if not results or not (coded or any(r.extras for r in results)):
        return failed
    counts = Counter(r.reason for r in coded if not r.invalid)
    out = {
        **failed,
        **({f"reward/code/{reason}_frac": counts.get(reason, 0) / n for reason in REASONS} if coded else {}),
    }
    if coded:  # other extras (the reward model's model/raw) are no code outcome
        out["reward/code/pass_frac"] = counts.get(None, 0) / n
    for key in sorted({k for r in results for k in r.extras}):
        vals = [r.extras[key] for r in results if key in r.extras and isfinite(r.extras[key])]
        out[f"reward/{key}"] = sum(vals) / len(vals) if vals else float("nan")
    return out
