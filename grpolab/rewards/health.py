"""Stopping a run whose reward cannot score anything: ``RewardFailureStreak``.

A reward that raises on every call makes every sample invalid; the update then has nothing to learn from, and a
run that goes on anyway ends "done" having learned nothing. The trainer records each step's reward results (its
``RewardResult`` list, grpolab.rewards) and stops, naming the reward and its last exception, once the same failure
has lasted ``limit`` steps in a row:

- a weighted reward (weight != 0) that failed on every sample of the step, or
- a step in which every sample is invalid for any reason (an agent episode that never ends, several rewards each
  failing on part of the samples).

A log-only reward (weight 0) never stops the run (it never invalidates a sample); one that failed on every sample
for ``limit`` steps is logged once as a warning, and ``reward/<name>/failed_frac`` shows it every step.
Checkpoints are written by the trainer between steps, so the ones already on disk stay intact when it stops.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from .reward_set import RewardResult

log = logging.getLogger("grpolab")

MAX_FAILED_REWARD_STEPS = 3  # consecutive steps with a reward failing on every sample before the run stops
ALL_INVALID = "every sample"  # the streak key of steps whose samples are all invalid, whatever the cause


def failing_everywhere(results: Sequence[RewardResult]) -> dict[str, str]:
    """{reward name: its last failure "<ExceptionType>: <message>"} for every reward that failed on every one of
    `results` (empty for no results).

    >>> bad = RewardResult(float("nan"), invalid=True, failures={"mine": "ValueError: x"})
    >>> failing_everywhere([bad, bad]), failing_everywhere([bad, RewardResult(1.0)])
    ({'mine': 'ValueError: x'}, {})
    """
    if not results:
        return {}
    names = set(results[0].failures).intersection(*(r.failures for r in results[1:]))
    return {name: results[-1].failures[name] for name in sorted(names)}


@dataclass
class RewardFailureStreak:
    """Consecutive steps in which a reward failed on every sample (see the module text); ``record`` returns the
    message to stop with once a streak reaches ``limit``, else None. ``fields``: where each user reward was defined
    (RewardSet.fields, e.g. ``reward.functions.mine``), named in the message."""

    limit: int = MAX_FAILED_REWARD_STEPS
    fields: dict[str, str] = field(default_factory=dict)
    streaks: dict[str, int] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"limit: expected an integer >= 1, got {self.limit}")

    def record(self, step: int, results: Sequence[RewardResult]) -> str | None:
        """Count step `step`'s results; the stop message when a weighted reward (or the whole batch) has failed
        everywhere for `limit` steps in a row."""
        failing = failing_everywhere(results)
        if results and all(r.invalid for r in results):
            first = next((r.error for r in results if r.error), None)
            failing.setdefault(ALL_INVALID, results[-1].error or first or "no valid reward")
        self.streaks = {name: self.streaks.get(name, 0) + 1 for name in failing}
        log_only = {name for r in results for name in r.log_only}
        for name, count in self.streaks.items():
            if count < self.limit:
                continue
            if name in log_only:
                if name not in self.warned:
                    self.warned.add(name)
                    log.warning(
                        "step %d: the log-only reward %r failed on every sample for %d steps in a row "
                        "(last: %s); training goes on (weight 0)",
                        step,
                        name,
                        count,
                        failing[name],
                    )
                continue
            where = f" ({self.fields[name]})" if name in self.fields else ""
            what = (
                "every sample was invalid" if name == ALL_INVALID else f"reward {name!r}{where} failed on every sample"
            )
            return (
                f"step {step}: {what} for {count} consecutive steps (steps {step - count + 1}-{step}); last "
                f"error: {failing[name]}. Nothing was learned from these steps: fix the reward (or what it "
                f"depends on) and resume the run (with --allow-changes if you edited the reward's source)"
            )
        return None
