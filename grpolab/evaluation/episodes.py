"""Held-out evaluation of agent tasks: one greedy episode per held-out initial state, with long-horizon credit
assignment evaluated on its own -- success per horizon slice and where failed episodes went wrong.

Per episode (one "item") the scores are ``accuracy`` (success: the environment's reward reached full marks, >= 1;
an invalid episode is a failure), ``turns``, ``tool_calls``, ``tool_errors``, ``invalid`` and ``ended_<x>`` for each
way of ending (done, max_turns, max_turn_tokens, max_total_tokens, invalid), and ``failed_<reason>`` for each
failure reason (FAILURES; for every episode ``accuracy`` + the sum of the ``failed_*`` is 1); every one is summarised
by grpolab.evaluation.result.summarise, i.e. mean with a 95% percentile-bootstrap interval over episodes, overall and
per slice, and compared between models by the paired bootstrap. ``length`` is the episode's model tokens;
``truncated`` = ended by a bound.

Episodes of ``openai_agent`` problems are played by the agent program itself, unmodified, against an endpoint of the
evaluation's own that serves the model under evaluation greedily (the agent's ``temperature`` is checked, not used)
and judges each episode by its environment, whatever the training reward (`episode_runner`); its sessions are new
ones, on the test split.

Slices: the problem's own slice and, where the environment labels the tool calls an expert needs
(``problem.data["expert_calls"]``), the horizon slice ``calls=0|1|2|3+`` (grpolab.agents.env.horizon_slice).

Where an episode fails (``failure``: reason and turn, `failure_of`), the first that applies:
  invalid              the environment or a tool failed (a bug, not the model): the turn it happened on
  malformed_call       a tool call without a well-formed ``name(argument)`` or naming no tool: its first such turn
  tool_error           a call the tool refused (ToolError: a bad expression, a box that does not exist): first such
  bound_hit            a bound ended the episode (max_turns, max_turn_tokens, max_total_tokens): the last turn
  misused_tool_result  the gold answer was in a tool's result, and the answer was still wrong: the answer turn
  wrong_answer         anything else: the answer turn
The result's metrics also hold, for each reason and turn that occurred, ``failed_<reason>@turn<k>``: {"mean": the
share of all episodes that failed there} (`failures_by_turn`; no interval: the per-reason scores carry those).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

from ..agents.env import horizon_slice
from ..agents.episode import BOUNDS, ENDINGS, EpisodeResult, EpisodeRunner
from ..agents.openai_agent import OpenAIAgentRunner, is_openai_agent_problem
from ..errors import GrpolabError
from ..rollout.base import SamplingParams
from ..tasks.base import Problem
from .result import summarise

EVAL_MODEL_ID = "grpolab-eval"  # the id an openai_agent evaluation serves when no model name is given
FAILURES = ("invalid", "malformed_call", "tool_error", "bound_hit", "misused_tool_result", "wrong_answer")


def mentions(text: str, gold: str) -> bool:
    """Whether `gold` occurs in `text` as a whole token (not inside a longer number or word).

    >>> mentions("calculator result: 386", "386"), mentions("result: 1386", "386"), mentions("x", "")
    (True, False, False)
    """
    return bool(gold) and re.search(rf"(?<![\w.]){re.escape(gold)}(?![\w]|\.\d)", text) is not None


def failure_of(result: EpisodeResult, gold: str) -> tuple[str, int] | None:
    """(reason, turn) where the episode failed (rules in the module docstring); None for a success.

    >>> r = EpisodeResult(reward=0.0, ended_by="done", turns=2, tool_calls=1,
    ...                   trace=[{"turn": 1, "kind": "call", "observation": "calculator result: 386"}])
    >>> failure_of(r, "386"), failure_of(r, "387")
    (('misused_tool_result', 2), ('wrong_answer', 2))
    """
    if result.reward >= 1.0:
        return None
    if result.invalid:
        return "invalid", result.turns
    for kind in ("malformed_call", "tool_error"):
        turns = [step["turn"] for step in result.trace if step["kind"] == kind]
        if turns:
            return kind, turns[0]
    if result.ended_by in BOUNDS:
        return "bound_hit", result.turns
    if any(step["kind"] == "call" and mentions(step["observation"], gold) for step in result.trace):
        return "misused_tool_result", result.turns
    return "wrong_answer", result.turns


def episode_item(problem: Problem, result: EpisodeResult, transcript: str) -> dict[str, Any]:
    success = result.reward >= 1.0
    failure = failure_of(result, problem.answer)
    scores = {
        "accuracy": float(success),
        "turns": float(result.turns),
        "tool_calls": float(result.tool_calls),
        "tool_errors": float(result.tool_errors),
        "invalid": float(result.invalid),
        **{f"ended_{e}": float(result.ended_by == e) for e in ENDINGS},
        **{f"failed_{f}": float(failure is not None and failure[0] == f) for f in FAILURES},
    }
    if result.requires_tools:
        scores["success_without_tool"] = float(success and result.tool_calls == 0)
    slices = [problem.slice]
    if "expert_calls" in problem.data:
        slices.append(horizon_slice(int(problem.data["expert_calls"])))
    return {
        "uid": problem.uid,
        "slice": problem.slice,
        "slices": slices,
        "gold": problem.answer,
        "completion": transcript,
        "answer": result.final_text[:500],
        "correct": success,
        "reward": result.reward,
        "ended_by": result.ended_by,
        "error": result.error,
        "failure": None if failure is None else {"reason": failure[0], "turn": failure[1]},
        "trace": [{k: step[k] for k in ("turn", "kind")} for step in result.trace],
        "length": result.model_tokens,
        "truncated": result.ended_by in BOUNDS,
        "scores": scores,
    }


def failures_by_turn(items: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The share of all episodes that failed for each reason at each turn, keyed ``failed_<reason>@turn<k>``.

    >>> failures_by_turn([{"failure": None}, {"failure": {"reason": "bound_hit", "turn": 3}}])
    {'failed_bound_hit@turn3': {'mean': 0.5}}
    """
    counts = Counter(f"failed_{it['failure']['reason']}@turn{it['failure']['turn']}" for it in items if it["failure"])
    return {key: {"mean": counts[key] / len(items)} for key in sorted(counts)}


def episode_runner(engine, tokenizer, problems: list[Problem], model: str) -> Any:
    """What plays the held-out episodes: grpolab's runner, or for ``openai_agent`` problems the agent itself against
    an endpoint of its own that serves the model under evaluation greedily as `model` (grpolab.agents.openai_agent,
    ``held_out``: judged by the environment)."""
    if problems and is_openai_agent_problem(problems[0]):
        return OpenAIAgentRunner(engine, tokenizer, model or EVAL_MODEL_ID, held_out=True)
    return EpisodeRunner.from_engine(engine)


def evaluate_episodes(engine, tokenizer, problems: list[Problem], settings, progress=None) -> Any:
    """EvalResult (grpolab.evaluation.result) of one greedy episode per problem, settings.batch_size episodes at a time;
    ``progress("episodes", done, total)`` after each batch (grpolab.evaluation.heldout.Progress)."""
    if settings.samples > 0:
        raise GrpolabError("agent tasks are evaluated with one greedy episode per problem; --samples is not supported")
    runner = episode_runner(engine, tokenizer, problems, settings.model)
    params = SamplingParams(group_size=1, greedy=True, logprobs=False)
    start, items = time.perf_counter(), []
    try:
        for i in range(0, len(problems), settings.batch_size):
            chunk = problems[i : i + settings.batch_size]
            episodes = runner.run(chunk, 1, params)
            items += [episode_item(p, r, t) for p, r, t in zip(chunk, episodes.results, episodes.rollout.texts)]
            if progress:
                progress("episodes", len(items), len(problems))
    finally:
        if isinstance(runner, OpenAIAgentRunner):
            runner.close()  # its endpoint: one per evaluation
    result = summarise(items, time.perf_counter() - start)
    result.metrics.update(failures_by_turn(items))
    return result
