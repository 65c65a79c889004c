"""Truncation caught early: a run whose first steps cut most completions at rollout.max_new_tokens says so, once,
with the limit that would fit.

A completion that hits the limit without ending gets a reward for a cut-off answer (usually 0: no final answer),
so a run that truncates most of its completions "trains but nothing learns" (TRL's default of 256 tokens truncates
97-99% of its own quickstart's completions). The rule:

  over the first WINDOW_STEPS = 3 steps of a run, pooled over the steps seen so far, warn at the first step where
  truncated / completions > THRESHOLD = 0.5 (more than half: "most").

Why these: in three steps the policy has barely moved from the base model, so the early lengths are the base
model's, and the check costs nothing; three steps of P x G completions (the quickstart: 3 x 32) put the share's
sampling error (<= 0.5 / sqrt(n): 5 points at n = 96) far below the gap between a healthy run (a few percent cut;
the release gate warns from 20% late in a run, grpolab.gate.training.check_truncation_drift) and a broken one
(> 90%). Warning at the first step that crosses means a run that truncates everything says so after one step.

The lengths are the sampled batch's (every group generated in the step, before dynamic sampling keeps any; all
ranks'), so an all-truncated group that dynamic sampling drops still counts. Agent episodes (ended by a turn or
token bound of their own) are not watched. The evidence is written to the run directory's truncation.json (per
step: completions, truncated, the finished lengths; the pooled share; the suggestion and its basis); the warning
is one line of the "grpolab" logger (stderr on the console: `grpolab train` prints it as `warning: ...`).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Sequence

import torch

from ..manifest import write_json_atomic

log = logging.getLogger("grpolab")

WINDOW_STEPS = 3  # the first steps of a run that are watched
THRESHOLD = 0.5  # warn when the pooled truncated share is above this
COVERAGE = 0.95  # the suggested limit aims to let this share of completions end
MIN_FINISHED = 8  # finished completions (with distinct lengths) needed to fit their distribution
FILE = "truncation.json"


def ceil_to(x: float, multiple: int) -> int:
    """The smallest multiple of `multiple` >= x."""
    return int(math.ceil(x / multiple) * multiple)


def lognormal_quantile(finished: Sequence[int], total: int, q: float = COVERAGE) -> float | None:
    """The q-quantile of completion length from right-censored lengths: the finished ones and `total` in all (the
    others cut at the limit, their lengths unknown beyond it); None when it cannot be fitted.

    Censored probability plotting: sort the k finished lengths x_(1) <= ... <= x_(k); among all n completions they
    are the k shortest (every cut one ran at least to the limit), so x_(i) sits at the plotting position
    p_i = (i - 0.5) / n. A log-normal length has log x_(i) = mu + sigma * z_i with z_i = Phi^-1(p_i); fit mu, sigma
    by least squares and return exp(mu + sigma * Phi^-1(q)). Dividing by n (not k) is what accounts for the cut
    ones: fitting the finished lengths alone (p_i = (i - 0.5) / k) would describe the short ones as if they were all.
    Needs >= MIN_FINISHED finished lengths, not all equal.
    """
    xs = sorted(int(x) for x in finished if x > 0)
    if len(xs) < MIN_FINISHED or len(set(xs)) < 2 or total < len(xs):
        return None
    normal = NormalDist()
    z = [normal.inv_cdf((i + 0.5) / total) for i in range(len(xs))]
    y = [math.log(x) for x in xs]
    mz, my = sum(z) / len(z), sum(y) / len(y)
    szz = sum((a - mz) ** 2 for a in z)
    sigma = sum((a - mz) * (b - my) for a, b in zip(z, y)) / szz
    if sigma <= 0:
        return None
    return math.exp(my - sigma * mz + sigma * normal.inv_cdf(q))


def suggest_max_new_tokens(limit: int, finished: Sequence[int], total: int) -> tuple[int, str]:
    """(the rollout.max_new_tokens to try, its basis) when most of `total` completions hit `limit`.

      S = min(8 L, max(2 L, ceil32(q95)))       L = the limit, q95 = lognormal_quantile(finished, total, 0.95)

    Truncated lengths are censored, so a value that fits is an extrapolation past L: with more than half cut, the
    median length is already beyond L. Never below 2 L: a limit that lets 95% of completions end lies above the
    median by the spread of the lengths (x exp(1.645 sigma), 2.3 at sigma = 0.5), so less than doubling would
    truncate again. Never above 8 L: the finished lengths are the lower tail, which says little that far out; the
    next run's own check says whether it is still short. No fit (fewer than MIN_FINISHED finished, or all of one
    length): S = 2 L.
    """
    q = lognormal_quantile(finished, total)
    if q is None:
        return 2 * limit, f"{total - len(finished)} of {total} cut and too few finished to fit: twice the limit"
    value = min(8 * limit, max(2 * limit, ceil_to(q, 32)))
    basis = (
        f"the 95th percentile of a log-normal fitted to the {len(finished)} finished lengths, censored at {limit} "
        f"(estimated {q:.0f} tokens), kept within [2, 8] x the limit"
    )
    return value, basis


@dataclass
class StepRecord:
    """One watched step: its sampled completions, how many hit the limit, the lengths of the ones that ended."""

    step: int
    completions: int
    truncated: int
    finished_lengths: list[int] = field(default_factory=list)


def warned_before(records: list[StepRecord]) -> bool:
    """Whether a run with these step records warned already: the pooled share over steps 1..k crossed THRESHOLD at
    some k (it need not still be above it; the warning is given once, at the first crossing).

    >>> warned_before([StepRecord(1, 4, 4), StepRecord(2, 4, 0)]), warned_before([StepRecord(1, 4, 2)])
    (True, False)
    """
    total = cut = 0
    for r in sorted(records, key=lambda r: r.step):
        total, cut = total + r.completions, cut + r.truncated
        if total and cut / total > THRESHOLD:
            return True
    return False


class TruncationWatch:
    """Watches the first WINDOW_STEPS steps of a run (``observe`` after each step); rank 0 only (``active``).

    On a resumed run the steps already recorded in truncation.json (before the step being observed) are read back
    once, so the pooled share is the run's, not the process's."""

    def __init__(self, run_dir: Path, limit: int, active: bool = True):
        self.path, self.limit, self.active = Path(run_dir) / FILE, limit, active
        self.records: list[StepRecord] | None = None  # read from the file at the first observation
        self.warned = False
        self.pending: dict[str, float] = {}  # the warning step's metrics, handed over once by metrics()

    def load(self, before_step: int) -> list[StepRecord]:
        """The records truncation.json holds for steps before `before_step` (none when there is no file)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        if data.get("max_new_tokens") != self.limit:  # the limit changed on resume: a new question
            return []
        return [StepRecord(**r) for r in data.get("steps", []) if r.get("step", before_step) < before_step]

    def observe(self, step: int, lengths: torch.Tensor | None, truncated: torch.Tensor | None) -> str | None:
        """Record step `step` (1-based) of the sampled batch's completion lengths and truncation flags; returns (and
        logs as a warning) the message the first time the pooled share crosses THRESHOLD, else None."""
        if not self.active or step > WINDOW_STEPS or lengths is None or truncated is None:
            return None
        if self.records is None:  # a resume: the steps before this one as recorded, and whether they warned
            self.records = self.load(step)
            self.warned = warned_before(self.records)
        cut = truncated.bool().cpu()
        finished = sorted(int(x) for x in lengths.cpu()[~cut].tolist())
        self.records = [r for r in self.records if r.step < step]
        self.records.append(StepRecord(step, int(cut.numel()), int(cut.sum()), finished))
        summary = self.summary()
        message = None
        if summary["truncated_frac"] > THRESHOLD and not self.warned:
            self.warned = True
            message = self.message(summary)
            log.warning(message)
            self.pending = {
                "completion/first_steps_truncated_frac": summary["truncated_frac"],
                "completion/max_new_tokens_to_try": float(summary["suggested_max_new_tokens"]),
            }
        summary["warned"] = self.warned
        if self.path.parent.is_dir():  # a Trainer used without a run directory (benchmarks) only warns
            write_json_atomic(self.path, summary)
        return message

    def metrics(self) -> dict[str, float]:
        """At the step that warned: the pooled truncated share and the rollout.max_new_tokens to try, as metrics of
        that step (the release report's truncation check reads them from metrics.jsonl); {} on every other step."""
        out, self.pending = self.pending, {}
        return out

    def summary(self) -> dict[str, Any]:
        """What truncation.json holds: the rule, each watched step, the pooled share and (above the threshold) the
        suggested rollout.max_new_tokens with its basis."""
        records = self.records or []
        total, cut = sum(r.completions for r in records), sum(r.truncated for r in records)
        finished = [x for r in records for x in r.finished_lengths]
        frac = cut / total if total else 0.0
        out: dict[str, Any] = {
            "rule": f"warn when more than {THRESHOLD:.0%} of the completions of the first {WINDOW_STEPS} steps "
            "(pooled over the steps seen) hit rollout.max_new_tokens without ending",
            "max_new_tokens": self.limit,
            "window_steps": WINDOW_STEPS,
            "threshold": THRESHOLD,
            "completions": total,
            "truncated": cut,
            "truncated_frac": frac,
            "suggested_max_new_tokens": None,
            "suggestion_basis": None,
            "steps": [asdict(r) for r in records],
        }
        if frac > THRESHOLD:
            out["suggested_max_new_tokens"], out["suggestion_basis"] = suggest_max_new_tokens(
                self.limit, finished, total
            )
        return out

    def message(self, s: dict[str, Any]) -> str:
        """The console line: the share, the limit, what it does to the run, the value to try and why."""
        steps = [r["step"] for r in s["steps"]]
        span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
        return (
            f"{span}: {s['truncated']} of {s['completions']} completions ({s['truncated_frac']:.0%}) hit "
            f"rollout.max_new_tokens = {self.limit} without ending: the reward scores answers cut off before they "
            f"end, so the run may train but learn nothing. Try rollout.max_new_tokens = {s['suggested_max_new_tokens']} "
            f"({s['suggestion_basis']}); evidence in {FILE}"
        )
