"""Reward registry and weighted scoring of one completion.

Every reward is a plain function ``fn(completion, gold) -> float``. ``score_completion`` combines
the named ones as ``total = sum(weights[name] * fn(completion, gold))``. A reward that raises makes
the result invalid (``total`` is NaN and ``error`` says which reward failed and why); it is never
silently counted as 0.

Time limits: each ``RewardSpec`` records ``time_limit_s``, but it is NOT enforced yet (no threads or
signals are used here); enforcing it is left to a later change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from grpolab.errors import ConfigError
from grpolab.rewards.math import correctness_reward, extract_answer, format_reward, normalize_answer


@dataclass(frozen=True)
class RewardSpec:
    """A registered reward: the function, what it measures, and its (not yet enforced) time limit."""

    fn: Callable[[str, str], float]
    description: str
    time_limit_s: float = 5.0


@dataclass(frozen=True)
class RewardResult:
    """Outcome of scoring one completion.

    ``components`` holds the unweighted value of every reward named in the weights (NaN for one
    that raised); ``total`` is their weighted sum, or NaN when ``invalid``; ``error`` is
    ``"<name>: <ExceptionType>: <message>"`` (several joined by ``"; "``) or None.
    """

    total: float
    components: dict[str, float] = field(default_factory=dict)
    invalid: bool = False
    error: str | None = None


REWARD_FUNCTIONS: dict[str, RewardSpec] = {
    "correct": RewardSpec(correctness_reward, "1.0 if the last boxed answer (or last number) equals the gold answer"),
    "format": RewardSpec(format_reward, "1.0 if the completion contains \\boxed{"),
}


def score_completion(completion: str, gold: str, weights: dict[str, float]) -> RewardResult:
    """Weighted sum of the rewards named in ``weights``; unknown names raise ConfigError.

    >>> r = score_completion("\\\\boxed{4}", "4", {"correct": 1.0, "format": 0.1})
    >>> r.total, r.components, r.invalid
    (1.1, {'correct': 1.0, 'format': 1.0}, False)
    """
    unknown = [name for name in weights if name not in REWARD_FUNCTIONS]
    if unknown:
        raise ConfigError(
            f"unknown reward component(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(map(repr, sorted(REWARD_FUNCTIONS)))}"
        )
    components: dict[str, float] = {}
    errors: list[str] = []
    for name in weights:
        try:
            components[name] = float(REWARD_FUNCTIONS[name].fn(completion, gold))
        except Exception as exc:  # a broken reward must be visible, never a silent 0
            components[name] = float("nan")
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    if errors:
        return RewardResult(float("nan"), components, True, "; ".join(errors))
    total = sum(weights[name] * components[name] for name in weights)
    return RewardResult(float(total), components, False, None)


__all__ = [
    "REWARD_FUNCTIONS",
    "RewardResult",
    "RewardSpec",
    "correctness_reward",
    "extract_answer",
    "format_reward",
    "normalize_answer",
    "score_completion",
]
