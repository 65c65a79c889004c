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
step after step stops the run (grpolab.rewards.health). An answer reward (``correct``, ``format``) given a code
problem is such an error. A user's function declared batched (``@grpolab.batched``, grpolab.rewards.user) gets
such a batched form: one call per batch under one time limit; a return that is not one value per completion makes
the whole batch invalid.
Each ``RewardSpec`` declares ``time_limit_s`` (None = no limit), and it is enforced (grpolab.rewards.worker).

Modules:
- the combination: registry (REWARD_FUNCTIONS, the built-in rewards by name), reward_set (RewardSet, RewardResult,
  score_completion), worker (calls under a time limit on a daemon thread), metrics (result_metrics), card (the
  reward part of the objective card; the stop rule the rewards call for, resolved by grpolab.rollout.stop), health
  (the stop on rewards that fail every sample);
- the rewards: spec (RewardSpec), math (answer rewards), code (sandboxed tests), model (a learned reward model),
  judge (an LLM judge: judge_local, judge_http), user (a user's functions), overlong (the soft length penalty).

May import: config, errors, tasks, models, rollout, sandbox. Imported by: agents, training, baselines, report,
card, runs, the CLI.
"""

from __future__ import annotations

from grpolab.rewards.card import reward_card, stop_rule
from grpolab.rewards.code import Scored
from grpolab.rewards.math import correctness_reward, extract_answer, format_reward, normalize_answer
from grpolab.rewards.metrics import result_metrics
from grpolab.rewards.registry import CODE_REWARDS, CORRECTNESS_REWARDS, REWARD_FUNCTIONS
from grpolab.rewards.reward_set import RewardResult, RewardSet, score_completion
from grpolab.rewards.spec import RewardShapeError, RewardSpec
from grpolab.rewards.worker import call_with_time_limit

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
