"""RewardSet: the weighted rewards of a run, and RewardResult, the outcome of scoring one completion.

``total = sum(weights[name] * value)`` over the weighted rewards; a reward that raises, times out or returns None /
NaN / a non-number makes the result invalid (``total`` is NaN, ``error`` says which reward failed and why), never a
silent 0. A log-only reward (weight 0) never invalidates a sample: its failure is kept in ``failures``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from math import isnan
from typing import Any, Callable, Mapping, Sequence

from grpolab.errors import ConfigError
from grpolab.rewards.code import Scored, code_reward_specs
from grpolab.rewards.registry import CODE_REWARDS, REWARD_FUNCTIONS
from grpolab.rewards.spec import RewardShapeError, RewardSpec
from grpolab.rewards.worker import call_batched, call_with_time_limit
from grpolab.sandbox import SandboxLimits
from grpolab.sandbox.errors import SandboxConfigError
from grpolab.tasks.base import Problem
from grpolab.tasks.code import is_code_problem

log = logging.getLogger("grpolab")


@dataclass(frozen=True)
class RewardResult:
    """Outcome of scoring one completion.

    ``components`` holds the unweighted value of every reward named in the weights (NaN for one
    that raised); ``total`` is their weighted sum, or NaN when ``invalid``; ``error`` is
    ``"<name>: <ExceptionType>: <message>"`` (several joined by ``"; "``) or None. ``reason`` says why a valid
    result is not full marks where a reward knows (code: syntax, error, wrong_answer, timeout, limit, exit);
    ``extras`` holds per-sample numbers for metrics (code: ``code/shown_pass``, ``code/hidden_pass``, ``code/run_s``).
    ``failures`` maps every reward that failed on this completion to ``"<ExceptionType>: <message>"`` -- a weighted
    one makes the result invalid, a log-only one (weight 0, named in ``log_only``) does not.
    """

    total: float
    components: dict[str, float] = field(default_factory=dict)
    invalid: bool = False
    error: str | None = None
    reason: str | None = None
    extras: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    log_only: tuple[str, ...] = field(default=(), compare=False)  # the reward set's, not this result's own


def _as_reward(value: Any) -> float:
    """A reward function's return value as a float; None, NaN and non-numbers raise (the sample is invalid)."""
    if value is None:
        raise ValueError("returned None (no valid reward)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise TypeError(f"returned {type(value).__name__} {value!r:.40}, expected a float or None")
    out = float(value)
    if isnan(out):
        raise ValueError("returned NaN")
    return out


class RewardSet:
    """The weighted rewards of a run: built-ins and the user's own functions (grpolab.rewards.user), each run under
    its time limit; the code rewards use the sandbox with ``sandbox`` limits (grpolab.sandbox.SandboxLimits).

    ``score_many(completions, problems)`` / ``score(completion, problem)`` give ``total = sum(weights[name] *
    value)``; a reward that raises, times out or returns None / NaN / a non-number makes the result invalid with the
    reason, never a silent 0. ``callables`` are Python functions passed in directly (grpolab.train(rewards=...)),
    named like config functions; each must be weighted. ``user`` holds every user function by name, ``fields``
    the config field (or ``rewards['name']``) each came from.
    """

    def __init__(
        self,
        weights: dict[str, float],
        functions: dict[str, str] | None = None,
        time_limit_s: float | None = 5.0,
        sandbox: Mapping[str, Any] | None = None,
        callables: Mapping[str, Callable[..., Any]] | None = None,
        model: Any = None,
        device: Any = None,
        judge: Any = None,
    ):
        from .judge import JUDGE_REWARD, judge_reward_spec
        from .model import MODEL_REWARD, model_reward_spec
        from .user import callable_label, check_reward_callable, load_reward_function

        self.weights = dict(weights)
        self.specs = dict(REWARD_FUNCTIONS)
        if MODEL_REWARD in self.weights:  # a learned reward model (config reward.model) on the run's device
            self.specs[MODEL_REWARD] = model_reward_spec(model, device)
        if JUDGE_REWARD in self.weights:  # an LLM judge (config reward.judge), local on the run's device or served
            self.specs[JUDGE_REWARD] = judge_reward_spec(judge, device)
        try:
            limits = SandboxLimits.from_options(sandbox)  # checked even when no code reward is weighted
        except SandboxConfigError as e:
            raise ConfigError(str(e)) from None
        if any(name in CODE_REWARDS for name in self.weights):
            self.specs.update({name: RewardSpec(**kw) for name, kw in code_reward_specs(limits).items()})
        self.user: dict[str, Callable[..., Any]] = {}
        self.fields: dict[str, str] = {}
        for name, ref in (functions or {}).items():
            field_path = f"reward.functions.{name}"
            self._check_name(field_path, name)
            if name not in self.weights:
                raise ConfigError(
                    f"{field_path}: defined but not weighted; add reward.weights.{name} (0 logs it "
                    "without training on it)"
                )
            self._add_user(name, load_reward_function(field_path, ref), field_path, f"user reward {ref}", time_limit_s)
        for name, fn in (callables or {}).items():
            field_path = f"rewards[{name!r}]"
            self._check_name(field_path, name)
            if name not in self.weights:
                raise ConfigError(f"{field_path}: passed in but not weighted; add reward.weights.{name} (e.g. 1.0)")
            label = callable_label(fn)
            self._add_user(
                name, check_reward_callable(field_path, fn, label), field_path, f"python reward {label}", time_limit_s
            )
        unknown = [name for name in self.weights if name not in self.specs]
        if unknown:
            raise ConfigError(
                f"reward.weights: unknown reward component(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(map(repr, sorted(self.specs)))} (add your own under reward.functions)"
            )

    def _check_name(self, field_path: str, name: Any) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{field_path}: expected a non-empty string as the reward's name")
        if name in REWARD_FUNCTIONS or name in ("model", "judge"):
            raise ConfigError(f"{field_path}: {name!r} is a built-in reward; give your function another name")
        if name in self.user:
            raise ConfigError(f"{field_path}: {name!r} is already defined by {self.fields[name]}; use one of them")

    def _add_user(
        self, name: str, fn: Callable[..., Any], field_path: str, description: str, limit_s: float | None
    ) -> None:
        from .user import is_batched

        self.user[name], self.fields[name] = fn, field_path
        batch = functools.partial(call_batched, fn, limit_s) if is_batched(fn) else None
        self.specs[name] = RewardSpec(fn, description, limit_s, takes_problem=True, batch=batch)

    def probe(self, problem: Problem) -> None:
        """Call every user function once on `problem` with its gold answer boxed as the completion, before any
        model is loaded: a return that is not a number or None (or, batched, not one value per completion) is a
        ConfigError naming the function's field; an exception or a time-out is only a warning (the function may
        reject that completion; during training it makes samples invalid)."""
        from .user import BATCHED_SIGNATURE, REWARD_SIGNATURE, is_batched

        completion = f"\\boxed{{{problem.answer}}}"
        for name, fn in self.user.items():
            out = self._outputs(name, [completion], [problem])[0]
            expected = BATCHED_SIGNATURE if is_batched(fn) else REWARD_SIGNATURE
            where = f"called on {completion!r} and problem {problem.uid!r} before training; expected {expected}"
            if isinstance(out, RewardShapeError):
                raise ConfigError(f"{self.fields[name]}: {out} ({where})")
            if isinstance(out, Exception):
                log.warning("%s: %s: %s (%s)", self.fields[name], type(out).__name__, out, where)
                continue
            try:
                _as_reward(out.value if isinstance(out, Scored) else out)
            except TypeError as exc:
                raise ConfigError(f"{self.fields[name]}: {exc} ({where})") from None
            except ValueError:  # None or NaN: a valid "no reward"
                pass

    def judge_record(self) -> dict[str, Any] | None:
        """The built judge's identity and rubric sha256 (grpolab.rewards.judge.judge_record), None without one."""
        from .judge import JUDGE_REWARD, judge_record

        spec = self.specs.get(JUDGE_REWARD) if JUDGE_REWARD in self.weights else None
        return judge_record(spec.batch) if spec is not None else None

    def callable_hashes(self) -> dict[str, str | None]:
        """{name: source hash} of the Python callables passed in (config functions are hashed by file)."""
        from .user import callable_source_hash

        return {
            name: callable_source_hash(fn)
            for name, fn in sorted(self.user.items())
            if self.fields[name].startswith("rewards[")
        }

    def score(self, completion: str, problem: Problem) -> RewardResult:
        return self.score_many([completion], [problem])[0]

    def score_many(self, completions: Sequence[str], problems: Sequence[Problem]) -> list[RewardResult]:
        """One RewardResult per completion (``problems[i]`` is the problem of ``completions[i]``); batched rewards
        score the whole list in one call (the code rewards in parallel), the others one completion at a time."""
        if len(completions) != len(problems):
            raise ValueError(f"{len(completions)} completions but {len(problems)} problems")
        outputs = {name: self._outputs(name, completions, problems) for name in self.weights}
        return [self._combine({name: outputs[name][i] for name in self.weights}) for i in range(len(completions))]

    def _outputs(self, name: str, completions: Sequence[str], problems: Sequence[Problem]) -> list[Any]:
        """Every completion's raw output of reward `name` (a value, a Scored or the exception it raised)."""
        spec = self.specs[name]
        if spec.batch is not None:
            try:
                out = list(spec.batch(completions, problems))
            except Exception as exc:  # the whole batch failed: every sample says why
                return [exc] * len(completions)
            if len(out) != len(completions):
                return [RewardShapeError(f"returned {len(out)} results for {len(completions)} completions")] * len(
                    completions
                )
            return out
        takes_problem = spec.takes_problem or name in self.user
        out: list[Any] = []
        for completion, problem in zip(completions, problems):
            if not takes_problem and is_code_problem(problem):
                out.append(
                    TypeError(
                        f"compares a final answer, but {problem.uid} is a code problem; weight "
                        "pass_fraction or all_pass instead"
                    )
                )
                continue
            try:
                out.append(
                    call_with_time_limit(
                        spec.fn, (completion, problem if takes_problem else problem.answer), spec.time_limit_s
                    )
                )
            except Exception as exc:  # a broken reward must be visible, never a silent 0
                out.append(exc)
        return out

    def _combine(self, outputs: dict[str, Any]) -> RewardResult:
        """One completion's result: total = sum over the weighted rewards (weight != 0) of weight * value; invalid
        when one of them failed. A failed log-only reward (weight 0) is NaN in ``components`` and named in
        ``failures`` only."""
        components: dict[str, float] = {}
        failures: dict[str, str] = {}
        reason, extras = None, {}
        for name, out in outputs.items():
            if isinstance(out, Scored):
                reason = reason or out.reason
                extras.update(out.extras)
                out = ValueError(out.error) if out.error else out.value
            try:
                if isinstance(out, Exception):
                    raise out
                components[name] = _as_reward(out)
            except Exception as exc:
                components[name] = float("nan")
                failures[name] = f"{type(exc).__name__}: {exc}"
        log_only = tuple(name for name in self.weights if self.weights[name] == 0)
        weighted_failures = [name for name in failures if name not in log_only]
        if weighted_failures:
            error = "; ".join(f"{name}: {failures[name]}" for name in weighted_failures)
            return RewardResult(float("nan"), components, True, error, reason, extras, failures, log_only)
        total = sum(self.weights[name] * components[name] for name in self.weights if name not in log_only)
        return RewardResult(float(total), components, False, None, reason, extras, failures, log_only)


def score_completion(completion: str, gold: str, weights: dict[str, float]) -> RewardResult:
    """Weighted sum of the built-in rewards named in ``weights``; unknown names raise ConfigError.

    >>> r = score_completion("\\\\boxed{4}", "4", {"correct": 1.0, "format": 0.1})
    >>> r.total, r.components, r.invalid
    (1.1, {'correct': 1.0, 'format': 1.0}, False)
    """
    return RewardSet(weights).score(completion, Problem(uid="", question="", answer=gold))
