"""The episode runner: G bounded multi-turn episodes per initial state, token-in / token-out.

An episode is one token sequence: [prompt | model turn 1 | observation 1 | model turn 2 | ...].

- **Model tokens are exactly the sampled ids.** Each turn continues the episode's own token sequence (prompt ids +
  every token so far), never a re-rendered, re-tokenized history; the ids the sampler drew are appended as they
  are, with their sampler logprobs. A model turn ends at a stop token (the chat template's end of turn).
- **Observation tokens are the chat template's rendering of the new message only**, tokenized once: the text the
  template puts between the model's end-of-turn token and the next generation prompt, e.g. for ChatML
  ``"\\n<|im_start|>user\\n" + observation + "<|im_end|>\\n<|im_start|>assistant\\n"``. A turn the model ended
  with another of its stop ids (e.g. ``<|endoftext|>`` where the template closes turns with ``<|im_end|>``) gets
  the template's own end-of-turn token at the start of the observation.
- ``loss_mask`` is 1 on model tokens only; ``completion_mask`` (what the model attends to) is 1 on every token.
  Observation tokens get sampler logprob 0.
- **Bounds** (grpolab.agents.env.EpisodeLimits): a turn gets at most max_turn_tokens sampled tokens and never more
  than the episode has left of max_total_tokens; a turn cut by either bound, the last allowed turn
  (max_turns) and an observation that does not fit all end the episode, recorded in ``ended_by``.
- **Failure is contained**: reset / step / reward run under the time limit (a thread: an overrunning environment
  call is abandoned), tools in the killable worker process (grpolab.agents.tools). A raise, a time-out or a
  malformed return makes that episode invalid with the reason; the others go on.

Sampling: episode k of group j draws from its own generator seeded by (the group's seed, k); a decode call draws
one number per live episode per step until its slowest episode stops, so a batch's episodes are a function of the
batch's seeds (reproducible, and exactly resumable). The environment's rng is seeded by the group's seed, so the G
episodes of a group start from the same state.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from ..models.load import eval_mode
from ..rewards import call_with_time_limit
from ..rollout.base import Rollout, SamplingParams
from ..rollout.decode import decode_groups
from ..rollout.grpolab_engine import left_pad
from ..tasks.base import Problem
from .env import EpisodeLimits, load_env
from .tools import WORKER, ToolError, ToolFailure, parse_tool_call, register_tool, tool_instructions
from .turns import EpisodeCache, decode_turn

BOUNDS = ("max_turns", "max_turn_tokens", "max_total_tokens")
ENDINGS = ("done", *BOUNDS, "invalid")
# what a model turn was, as the runner answered it: a tool call that ran, a malformed call (no well-formed
# name(argument), or an unknown tool), a call the tool refused (ToolError), or a turn for the environment's step
TURN_KINDS = ("call", "malformed_call", "tool_error", "action")
_SENTINEL = "\u2063GRPOLAB_TURN\u2063"


@dataclass
class EpisodeResult:
    """How one episode went. reward is NaN when invalid; ended_by is one of ENDINGS."""

    reward: float = math.nan
    ended_by: str = ""
    error: str | None = None
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    model_tokens: int = 0
    final_text: str = ""
    requires_tools: bool = False
    trace: list[dict] = field(default_factory=list)  # per answered turn: {"turn", "kind", "observation"} (TURN_KINDS)

    @property
    def invalid(self) -> bool:
        return self.ended_by == "invalid"


@dataclass
class _Episode:
    env: object
    limits: EpisodeLimits
    prompt: list[int]
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    loss: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    logp_full: list[float] = field(default_factory=list)
    result: EpisodeResult = field(default_factory=EpisodeResult)
    tool_keys: dict[str, str] = field(default_factory=dict)
    cache: EpisodeCache | None = None  # the keys/values of the tokens the model has read (reuse_cache)

    @property
    def active(self) -> bool:
        return not self.result.ended_by

    def add(
        self, ids: list[int], model: bool, logp: list[float] | None = None, full: list[float] | None = None
    ) -> None:
        self.tokens += ids
        self.loss += [int(model)] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)
        self.logp_full += full if full is not None else (logp if logp is not None else [0.0] * len(ids))


@dataclass
class Episodes:
    rollout: Rollout
    results: list[EpisodeResult]


def episode_seed(group_seed: int, k: int) -> int:
    return (group_seed * 1_000_003 + k) % (2**63 - 1)


class EpisodeRunner:
    """Runs episodes with a HF model (the rollout engine's sampler copy) and its tokenizer. reuse_cache: each
    episode keeps its key/value cache across turns, a turn feeds only its new tokens (grpolab.agents.turns); False
    re-reads each episode's whole sequence every turn (the reference the cached path is tested against)."""

    def __init__(self, model, tokenizer, stop_ids: list[int], reuse_cache: bool = True):
        self.model, self.tokenizer, self.stop_ids = model, tokenizer, stop_ids
        self.reuse_cache = reuse_cache
        self._observations: dict[tuple[str, str], list[int]] = {}

    @classmethod
    def from_engine(cls, engine) -> "EpisodeRunner":
        return cls(engine.model, engine.tokenizer, engine.stop_ids)

    # -------------------------------------------------------------------------------------- rendering

    def prompt_ids(self, first_observation: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": first_observation}], tokenize=False, add_generation_prompt=True
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def observation_ids(self, text: str, role: str, ended_with: int | None = None) -> list[int]:
        """The tokens the chat template adds for a `role` message after a finished model turn, up to and including
        the next generation prompt; rendered once per (text, role, ended_with). ``ended_with``: the stop token the
        model sampled to end its turn -- when the template closes the turn with that very token, it is not
        repeated (with several end ids, e.g. <|im_end|> and <|endoftext|>, only the one sampled is)."""
        key = (text, role, ended_with)
        if key not in self._observations:
            tok = self.tokenizer
            head = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}]
            closed = tok.apply_chat_template(head, tokenize=False)
            full = tok.apply_chat_template(
                head + [{"role": role, "content": text}], tokenize=False, add_generation_prompt=True
            )
            delta = full[full.index(_SENTINEL) + len(_SENTINEL) :]
            end_of_turn = tok.decode([ended_with]) if ended_with in self.stop_ids else ""
            tail = closed[closed.index(_SENTINEL) + len(_SENTINEL) :]
            if end_of_turn and tail.startswith(end_of_turn) and delta.startswith(end_of_turn):
                delta = delta[len(end_of_turn) :]  # the model's own stop token already closed its turn
            self._observations[key] = tok(delta, add_special_tokens=False)["input_ids"]
        return self._observations[key]

    # -------------------------------------------------------------------------------------- episodes

    def start(self, problem: Problem, group_seed: int, k: int, seeded: bool) -> tuple[_Episode, str | None]:
        """A fresh environment reset on `problem` with the group's rng; (episode, first observation or None)."""
        limits = EpisodeLimits.from_data(dict(problem.data["limits"]))
        env_cls = load_env(problem.data["env"])
        gen = torch.Generator().manual_seed(episode_seed(group_seed, k)) if seeded else None
        ep = _Episode(env=None, limits=limits, prompt=[], generator=gen)
        try:
            ep.env = call_with_time_limit(env_cls, (), limits.time_limit_s)
            first = call_with_time_limit(ep.env.reset, (problem, random.Random(group_seed)), limits.time_limit_s)
            if not isinstance(first, str):
                raise TypeError(f"returned {type(first).__name__}, expected the first observation as text")
        except Exception as exc:  # noqa: BLE001 -- the environment's bug: this episode is invalid
            self.fail(ep, f"reset: {type(exc).__name__}: {exc}")
            return ep, None
        ep.result.requires_tools = bool(getattr(ep.env, "requires_tools", False))  # may be set by reset
        tools = list(getattr(env_cls, "tools", []) or [])
        ep.tool_keys = {t.name: register_tool(problem.data["env"], t) for t in tools}
        return ep, (tool_instructions(tools) + "\n\n" if tools else "") + first  # the task itself last

    def fail(self, ep: _Episode, reason: str) -> None:
        ep.result.ended_by, ep.result.error, ep.result.reward = "invalid", reason, math.nan

    def finish(self, ep: _Episode, ended_by: str) -> None:
        """End the episode and read the environment's reward (a failure makes it invalid)."""
        try:
            value = call_with_time_limit(ep.env.reward, (), ep.limits.time_limit_s)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"returned {value!r:.40}, expected a finite number")
        except Exception as exc:  # noqa: BLE001
            self.fail(ep, f"reward: {type(exc).__name__}: {exc}")
            return
        ep.result.ended_by, ep.result.reward = ended_by, float(value)

    def run(
        self, problems: list[Problem], group_size: int, params: SamplingParams, seeds: list[int] | None = None
    ) -> Episodes:
        """group_size episodes per problem (1 when greedy), group-major; seeds: one per problem (its group's)."""
        g = 1 if params.greedy else group_size
        episodes: list[_Episode] = []
        for j, problem in enumerate(problems):
            seed = seeds[j] if seeds is not None else 0
            started = [self.start(problem, seed, k, seeds is not None) for k in range(g)]
            firsts = {first for _, first in started if first is not None}
            prompt = self.prompt_ids(sorted(firsts)[0] if firsts else problem.question)
            for ep, first in started:
                ep.prompt = prompt
                if first is not None and len(firsts) > 1:
                    self.fail(
                        ep,
                        "reset: the episodes of one group got different first observations; reset must "
                        "depend only on (problem, rng)",
                    )
            episodes += [ep for ep, _ in started]
        while any(ep.active for ep in episodes):
            self.turn([ep for ep in episodes if ep.active], params)
            for ep in episodes:
                if not ep.active:
                    ep.cache = None  # an ended episode's cache is never read again
        return Episodes(self.rollout(episodes, problems, g), [ep.result for ep in episodes])

    def turn(self, live: list[_Episode], params: SamplingParams) -> None:
        """One model turn of every live episode, then their observations (or their end)."""
        budgets = [min(ep.limits.max_turn_tokens, ep.limits.max_total_tokens - len(ep.tokens)) for ep in live]
        seqs = [ep.prompt + ep.tokens for ep in live]
        gens = [ep.generator for ep in live]
        sampling = dict(
            temperature=1.0 if params.greedy else params.temperature,
            stop_ids=self.stop_ids,
            pad_id=self.tokenizer.pad_token_id,
            greedy=params.greedy,
            top_k=params.top_k,
            top_p=params.top_p,
            generators=None if any(g is None for g in gens) else gens,
        )
        with torch.no_grad(), eval_mode(self.model):
            if self.reuse_cache:
                d, caches = decode_turn(self.model, seqs, [ep.cache for ep in live], max(budgets), **sampling)
                for ep, cache in zip(live, caches):
                    ep.cache = cache
            else:
                device = next(self.model.parameters()).device
                ids, mask = left_pad(seqs, self.tokenizer.pad_token_id)
                d = decode_groups(self.model, ids.to(device), mask.to(device), 1, max(budgets), **sampling)
        for i, (ep, budget) in enumerate(zip(live, budgets)):
            n = int(d.mask[i].sum())
            stopped = not bool(d.truncated[i]) and n <= budget
            n = min(n, budget)
            full = d.logprobs_untruncated[i, :n].tolist() if d.logprobs_untruncated is not None else None
            sampled = d.tokens[i, :n].tolist()
            ep.add(sampled, True, d.logprobs[i, :n].tolist(), full)
            ep.result.turns += 1
            ep.result.model_tokens += n
            if not stopped:
                self.finish(ep, "max_turn_tokens" if budget == ep.limits.max_turn_tokens else "max_total_tokens")
                continue
            self.respond(ep, self.tokenizer.decode(sampled, skip_special_tokens=True), sampled[-1])

    def respond(self, ep: _Episode, text: str, ended_with: int | None = None) -> None:
        """Answer a finished model turn (ended by the stop token ``ended_with``): run its tool call or step the
        environment, then append the observation."""
        ep.result.final_text = text
        call = parse_tool_call(text, frozenset(ep.tool_keys)) if ep.tool_keys else None
        last_turn = ep.result.turns >= ep.limits.max_turns
        if call is not None:
            if last_turn:
                return self.finish(ep, "max_turns")
            ep.result.tool_calls += 1
            if call.error:
                ep.result.tool_errors += 1
                observation, role, kind = f"Error: {call.error}", "tool_error", "malformed_call"
            else:
                try:
                    observation = WORKER.call(ep.tool_keys[call.name], call.argument, ep.limits.time_limit_s)
                    role, kind = "tool", "call"
                except ToolError as exc:
                    ep.result.tool_errors += 1
                    observation, role, kind = f"Error: {exc}", "tool_error", "tool_error"
                except ToolFailure as exc:
                    return self.fail(ep, f"tool {call.name}: {exc}")
            observation = f"{call.name or 'tool'} result: {observation}" if role == "tool" else observation
        else:
            try:
                out = call_with_time_limit(ep.env.step, (text,), ep.limits.time_limit_s)
                if not (
                    isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str) and isinstance(out[1], bool)
                ):
                    raise TypeError(f"returned {out!r:.60}, expected (observation: str, done: bool)")
            except Exception as exc:  # noqa: BLE001
                return self.fail(ep, f"step: {type(exc).__name__}: {exc}")
            (observation, done), kind = out, "action"
        ep.result.trace.append({"turn": ep.result.turns, "kind": kind, "observation": observation[:500]})
        if call is None and done:
            return self.finish(ep, "done")
        if last_turn:
            return self.finish(ep, "max_turns")
        delta = self.observation_ids(observation, getattr(ep.env, "observation_role", "user"), ended_with)
        if len(ep.tokens) + len(delta) >= ep.limits.max_total_tokens:  # no room for the observation and a token
            return self.finish(ep, "max_total_tokens")
        ep.add(delta, False)

    def rollout(self, episodes: list[_Episode], problems: list[Problem], g: int) -> Rollout:
        pad = self.tokenizer.pad_token_id
        for ep in episodes:
            if not ep.tokens:  # invalid at reset: one untrained token keeps every tensor non-empty
                ep.add([pad], False)
        prompt_ids, prompt_mask = left_pad([ep.prompt for ep in episodes], pad)
        width = max(len(ep.tokens) for ep in episodes)

        def right(rows: list[list], value, dtype) -> torch.Tensor:
            return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype)

        untruncated = right([ep.logp_full for ep in episodes], 0.0, torch.float32)
        logp = right([ep.logp for ep in episodes], 0.0, torch.float32)
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            completion_ids=right([ep.tokens for ep in episodes], pad, torch.long),
            completion_mask=right([[1] * len(ep.tokens) for ep in episodes], 0, torch.long),
            sampler_logprobs=logp,
            truncated=torch.tensor([ep.result.ended_by in BOUNDS for ep in episodes]),
            group=torch.arange(len(problems)).repeat_interleave(g),
            texts=[self.tokenizer.decode(ep.tokens) for ep in episodes],
            sampler_logprobs_untruncated=None if torch.equal(untruncated, logp) else untruncated,
            loss_mask=right([ep.loss for ep in episodes], 0, torch.long),
        )
