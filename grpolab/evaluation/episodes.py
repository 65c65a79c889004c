"""Held-out evaluation of agent tasks: one greedy episode per held-out initial state.

Per episode (one "item") the scores are ``accuracy`` (success: the environment's reward reached full marks, >= 1;
an invalid episode is a failure), ``turns``, ``tool_calls``, ``tool_errors``, ``invalid`` and ``ended_<x>`` for each
way of ending (done, max_turns, max_turn_tokens, max_total_tokens, invalid); every one is summarised by
grpolab.evaluation.result.summarise, i.e. mean with a 95% percentile-bootstrap interval over episodes, and compared between
models by the paired bootstrap. ``length`` is the episode's model tokens; ``truncated`` = ended by a bound.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import GrpolabError
from ..rollout.base import SamplingParams
from ..tasks.base import Problem
from .result import summarise
from ..agents.episode import BOUNDS, ENDINGS, EpisodeResult, EpisodeRunner


def episode_item(problem: Problem, result: EpisodeResult, transcript: str) -> dict[str, Any]:
    success = result.reward >= 1.0
    scores = {"accuracy": float(success), "turns": float(result.turns), "tool_calls": float(result.tool_calls),
              "tool_errors": float(result.tool_errors), "invalid": float(result.invalid),
              **{f"ended_{e}": float(result.ended_by == e) for e in ENDINGS}}
    if result.requires_tools:
        scores["success_without_tool"] = float(success and result.tool_calls == 0)
    return {"uid": problem.uid, "slice": problem.slice, "slices": [problem.slice], "gold": problem.answer,
            "completion": transcript, "answer": result.final_text[:500], "correct": success,
            "reward": result.reward, "ended_by": result.ended_by, "error": result.error,
            "length": result.model_tokens, "truncated": result.ended_by in BOUNDS, "scores": scores}


def evaluate_episodes(engine, tokenizer, problems: list[Problem], settings, progress=None) -> Any:
    """EvalResult (grpolab.evaluation.result) of one greedy episode per problem, settings.batch_size episodes at a time;
    ``progress("episodes", done, total)`` after each batch (grpolab.evaluation.heldout.Progress)."""
    if settings.samples > 0:
        raise GrpolabError("agent tasks are evaluated with one greedy episode per problem; --samples is not supported")
    runner = EpisodeRunner.from_engine(engine)
    params = SamplingParams(group_size=1, greedy=True, logprobs=False)
    start, items = time.perf_counter(), []
    for i in range(0, len(problems), settings.batch_size):
        chunk = problems[i : i + settings.batch_size]
        episodes = runner.run(chunk, 1, params)
        items += [episode_item(p, r, t) for p, r, t in zip(chunk, episodes.results, episodes.rollout.texts)]
        if progress:
            progress("episodes", len(items), len(problems))
    return summarise(items, time.perf_counter() - start)
