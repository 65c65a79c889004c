"""Reward registry and weighted scoring of completions.

A built-in answer reward is a plain function ``fn(completion, gold) -> float``; a built-in that needs the whole
problem (its task data, e.g. a code task's tests) says so with ``RewardSpec.takes_problem`` and is called
``fn(completion, problem)``; a user's own reward (config ``reward.functions``, grpolab.rewards.user) is
``fn(completion, problem) -> float | None``. A reward may also return ``Scored`` (value, the reason it is not full
marks, per-sample numbers for metrics) and may have a batched form (``RewardSpec.batch``: ``fn(completions,
problems) -> list``) that scores many completions at once -- the code rewards run their programs in parallel on
the sandbox pool that way. ``RewardSet`` combines the named ones as ``total = sum(weights[name] * value)``;
``score_many`` scores a batch, ``score`` one completion. A reward that raises, times out or returns None / NaN /
a non-number makes the result invalid (``total`` is NaN and ``error`` says which reward failed and why); it is
never silently counted as 0. A log-only reward (weight 0) never invalidates a sample: its failure is kept in
``failures`` and counted as ``reward/<name>/failed_frac`` (``result_metrics``). A reward that fails on every sample
step after step stops the run (grpolab.rewards.health). An answer reward (``correct``, ``format``) given a code problem is such an error.
A user's function declared batched (``@grpolab.batched``, grpolab.rewards.user) gets such a batched form: one call
per batch under one time limit; a return that is not one value per completion makes the whole batch invalid.

Time limits: each ``RewardSpec`` declares ``time_limit_s`` (None = no limit), and it is enforced. Rewards run
in a daemon worker thread and the caller waits at most the limit; a call that runs over makes the result
invalid (``"<name>: TimeoutError: ..."``) and the worker is abandoned -- a new one serves later calls, so a
hanging reward never hangs the trainer. A thread cannot be killed: an abandoned call keeps running in the
background until it returns (or the process exits), so a reward that spins forever in pure Python keeps
costing CPU. Rewards that can run away (untrusted code) belong in a sandboxed process, not here.

Modules: spec (RewardSpec), math (answer rewards), code (sandboxed tests), model (a learned reward model),
judge (an LLM judge: judge_local, judge_http), user (a user's functions), overlong (the soft length penalty). May import: config, errors, tasks, models, rollout,
sandbox. Imported by: agents, training, baselines, report, card, runs, the CLI.
"""

from __future__ import annotations

from math import isfinite, isnan
import functools
import logging
import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from grpolab.errors import ConfigError
from grpolab.rewards.spec import RewardShapeError, RewardSpec, env_reward
from grpolab.rewards.code import EXTRACTION_RULE, Scored, code_reward_specs
from grpolab.rewards.math import correctness_reward, extract_answer, format_reward, normalize_answer
from grpolab.sandbox import REASONS, SandboxLimits
from grpolab.sandbox.errors import SandboxConfigError
from grpolab.tasks.base import Problem
from grpolab.tasks.code import is_code_problem

if TYPE_CHECKING:
    from grpolab.config import Config

log = logging.getLogger("grpolab")


class _Worker:
    """One daemon thread running calls from its queue, one at a time."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="grpolab-reward", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, args, box, done = self.jobs.get()
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # reported to the caller, who decides
                box["error"] = exc
            done.set()


_worker: _Worker | None = None
_worker_lock = threading.Lock()


def call_with_time_limit(fn: Callable[..., Any], args: tuple, limit_s: float | None) -> Any:
    """fn(*args), raising TimeoutError when it has not returned within limit_s seconds (None: call directly).

    >>> call_with_time_limit(max, (1, 2), 1.0)
    2
    """
    global _worker
    if limit_s is None:
        return fn(*args)
    with _worker_lock:
        if _worker is None:
            _worker = _Worker()
        worker = _worker
        box: dict[str, Any] = {}
        done = threading.Event()
        worker.jobs.put((fn, args, box, done))
        try:
            finished = done.wait(limit_s)
        except BaseException:  # Ctrl-C while waiting: the worker may still be busy, do not reuse it
            _worker = None
            raise
        if not finished:
            _worker = None  # this one is stuck in fn: abandon it, the next call starts a fresh worker
            raise TimeoutError(f"exceeded its time limit of {limit_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


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


REWARD_FUNCTIONS: dict[str, RewardSpec] = {
    "correct": RewardSpec(correctness_reward, "1.0 if the last boxed answer (or last number) equals the gold answer"),
    "format": RewardSpec(format_reward, "1.0 if the completion contains \\boxed{"),
    "env": RewardSpec(env_reward, "an agent environment's reward() at the end of the episode (grpolab.agents)",
                      takes_problem=True),
    **{name: RewardSpec(**kwargs) for name, kwargs in code_reward_specs().items()},
}
CODE_REWARDS = ("pass_fraction", "all_pass")
# The component that says whether a completion is right, in order of preference: dynamic sampling judges a group's
# signal by it (grpolab.training.batch) and the report's hacking checks compare bonuses and length against it. `env` is an
# agent environment's verdict on the episode's end state, the one component an agent task allows.
CORRECTNESS_REWARDS = ("correct", "all_pass", "pass_fraction", "env")


def call_batched(fn: Callable[..., Any], limit_s: float | None, completions: Sequence[str],
                 problems: Sequence[Problem]) -> list[Any]:
    """fn(completions, problems) of a batched user reward under one time limit for the whole call; a return that is
    not a list or tuple of one value per completion raises RewardShapeError."""
    try:
        out = call_with_time_limit(fn, (list(completions), list(problems)), limit_s)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc} (one batched call for {len(completions)} completions)") from None
    if not isinstance(out, (list, tuple)):
        raise RewardShapeError(f"returned {type(out).__name__} {out!r:.40}, expected a list of one float or None "
                               f"per completion")
    if len(out) != len(completions):
        raise RewardShapeError(f"returned {len(out)} results for {len(completions)} completions; expected one float "
                               f"or None per completion")
    return list(out)


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

    def __init__(self, weights: dict[str, float], functions: dict[str, str] | None = None, time_limit_s: float | None = 5.0,
                 sandbox: Mapping[str, Any] | None = None, callables: Mapping[str, Callable[..., Any]] | None = None,
                 model: Any = None, device: Any = None, judge: Any = None):
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
                raise ConfigError(f"{field_path}: defined but not weighted; add reward.weights.{name} (0 logs it "
                                  "without training on it)")
            self._add_user(name, load_reward_function(field_path, ref), field_path, f"user reward {ref}", time_limit_s)
        for name, fn in (callables or {}).items():
            field_path = f"rewards[{name!r}]"
            self._check_name(field_path, name)
            if name not in self.weights:
                raise ConfigError(f"{field_path}: passed in but not weighted; add reward.weights.{name} (e.g. 1.0)")
            label = callable_label(fn)
            self._add_user(name, check_reward_callable(field_path, fn, label), field_path, f"python reward {label}",
                           time_limit_s)
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

    def _add_user(self, name: str, fn: Callable[..., Any], field_path: str, description: str,
                  limit_s: float | None) -> None:
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

    def callable_hashes(self) -> dict[str, str | None]:
        """{name: source hash} of the Python callables passed in (config functions are hashed by file)."""
        from .user import callable_source_hash

        return {name: callable_source_hash(fn) for name, fn in sorted(self.user.items())
                if self.fields[name].startswith("rewards[")}

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
                return [RewardShapeError(f"returned {len(out)} results for {len(completions)} completions")] * len(completions)
            return out
        takes_problem = spec.takes_problem or name in self.user
        out: list[Any] = []
        for completion, problem in zip(completions, problems):
            if not takes_problem and is_code_problem(problem):
                out.append(TypeError(f"compares a final answer, but {problem.uid} is a code problem; weight "
                                     "pass_fraction or all_pass instead"))
                continue
            try:
                out.append(call_with_time_limit(spec.fn, (completion, problem if takes_problem else problem.answer),
                                                spec.time_limit_s))
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
    out = {**failed, **({f"reward/code/{reason}_frac": counts.get(reason, 0) / n for reason in REASONS} if coded else {})}
    if coded:  # other extras (the reward model's model/raw) are no code outcome
        out["reward/code/pass_frac"] = counts.get(None, 0) / n
    for key in sorted({k for r in results for k in r.extras}):
        vals = [r.extras[key] for r in results if key in r.extras and isfinite(r.extras[key])]
        out[f"reward/{key}"] = sum(vals) / len(vals) if vals else float("nan")
    return out


def reward_card(weights: Mapping[str, float], specs: Mapping[str, RewardSpec] | None = None) -> dict[str, Any]:
    """The reward part of the objective card: each weighted reward's description and weight and, with a code
    reward, the rule by which code is extracted from a completion."""
    specs = specs or REWARD_FUNCTIONS
    card: dict[str, Any] = {"components": {name: {"weight": w, "description": specs[name].description if name in specs
                                                   else "user reward"} for name, w in weights.items()}}
    if any(name in CODE_REWARDS for name in weights):
        card["code_extraction"] = EXTRACTION_RULE
    return card


def score_completion(completion: str, gold: str, weights: dict[str, float]) -> RewardResult:
    """Weighted sum of the built-in rewards named in ``weights``; unknown names raise ConfigError.

    >>> r = score_completion("\\\\boxed{4}", "4", {"correct": 1.0, "format": 0.1})
    >>> r.total, r.components, r.invalid
    (1.1, {'correct': 1.0, 'format': 1.0}, False)
    """
    return RewardSet(weights).score(completion, Problem(uid="", question="", answer=gold))


__all__ = [
    "CODE_REWARDS",
    "CORRECTNESS_REWARDS",
    "REWARD_FUNCTIONS",
    "RewardResult",
    "RewardSet",
    "RewardShapeError",
    "RewardSpec",
    "stop_rule",
    "Scored",
    "call_with_time_limit",
    "correctness_reward",
    "extract_answer",
    "format_reward",
    "normalize_answer",
    "result_metrics",
    "reward_card",
    "score_completion",
]


def stop_rule(cfg: "Config") -> str:
    """rollout.stop_rule resolved: ``auto`` is code_block when the run weights a code reward (it reads the first
    Python block, so nothing after that block is sampled), else none."""
    if cfg.rollout.stop_rule != "auto":
        return cfg.rollout.stop_rule
    return "code_block" if reward_card(cfg.reward.weights).get("code_extraction") else "none"
