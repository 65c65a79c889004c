"""Expert episodes: an environment's scripted solver plays the model's part, and its episode is rendered exactly
as a sampled episode is (grpolab.agents.episode) -- the same prompt, the same observation tokens, the same loss mask
-- so a supervised warm start trains on the token sequences GRPO will later sample (grpolab.baselines.agent_sft).

An environment offers a solver as a classmethod ``expert(problem, turns) -> str``: the next model turn, given the
problem and the expert's earlier turns, each with the observation the runner answered it with (a tool's result, an
error, or the environment's reply). The turn's text is tokenized once and closed with the chat template's
end-of-turn token, as if the model had sampled those ids; the runner then answers it exactly as it answers the
model (tools in the worker, ``step``, the bounds). The built-ins: ``calc`` (one calculator call with the problem's
expression, then the result), ``lookup`` (open each box a note names, then the code), ``guess`` (binary search).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..tasks.base import Problem
from .env import load_env
from .episode import EpisodeResult, EpisodeRunner, _Episode

_SENTINEL = "\u2063GRPOLAB_EXPERT\u2063"


def end_of_turn_id(runner: EpisodeRunner) -> int:
    """The token the chat template closes an assistant message with (ChatML: <|im_end|>); it must be a stop id."""
    tok = runner.tokenizer
    closed = tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}], tokenize=False
    )
    tail = tok(closed[closed.index(_SENTINEL) + len(_SENTINEL) :], add_special_tokens=False)["input_ids"]
    if not tail or tail[0] not in runner.stop_ids:
        raise ConfigError(
            "the chat template does not close an assistant message with one of the model's stop tokens; "
            "expert episodes cannot end their turns as the model does"
        )
    return tail[0]


@dataclass
class ExpertEpisode:
    """One expert episode: the prompt ids, the episode's ids after the prompt, the loss mask (1 on the expert's
    turns), and how it went (an EpisodeResult: reward, turns, tool calls, ending)."""

    problem: Problem
    prompt: list[int]
    tokens: list[int]
    loss_mask: list[int]
    result: EpisodeResult


def expert_episode(runner: EpisodeRunner, problem: Problem, eot: int | None = None) -> ExpertEpisode:
    """Play `problem` with its environment's scripted solver (the environment's rng seeded by 0)."""
    env_cls = load_env(problem.data["env"])
    solver = getattr(env_cls, "expert", None)
    if not callable(solver):
        raise ConfigError(
            f"task.options.env: {problem.data['env']} has no expert(problem, turns) solver; supervised warm "
            "starts need one (grpolab/agents/expert.py)"
        )
    eot = end_of_turn_id(runner) if eot is None else eot
    ep, first = runner.start(problem, 0, 0, False)
    ep.prompt = runner.prompt_ids(first if first is not None else problem.question)
    turns: list[tuple[str, str]] = []
    while ep.active:
        text = solver(problem, turns)
        ids = runner.tokenizer(text, add_special_tokens=False)["input_ids"] + [eot]
        budget = min(ep.limits.max_turn_tokens, ep.limits.max_total_tokens - len(ep.tokens))
        _play_turn(runner, ep, text, ids, budget, eot)
        if ep.result.trace:
            turns.append((text, ep.result.trace[-1]["observation"]))
    return ExpertEpisode(problem, ep.prompt, ep.tokens, ep.loss, ep.result)


def _play_turn(runner: EpisodeRunner, ep: _Episode, text: str, ids: list[int], budget: int, eot: int) -> None:
    """Append the turn's ids as model tokens and answer it, ending the episode at a bound as a sampled turn would."""
    ep.result.turns += 1
    if len(ids) > budget:
        ep.add(ids[:budget], True)
        ep.result.model_tokens += budget
        return runner.finish(ep, "max_turn_tokens" if budget == ep.limits.max_turn_tokens else "max_total_tokens")
    ep.add(ids, True)
    ep.result.model_tokens += len(ids)
    runner.respond(ep, text, eot)
