#!/usr/bin/env python
"""Episode time at 1, 2 and 4 turns, re-reading each episode's whole sequence every turn against keeping its KV cache
across turns (grpolab/agents/turns.py; docs/agents.md, "KV cache across turns").

    python benchmarks/agent_turns.py                      # bundled SmolLM2-135M-Instruct, float32, 2 x 8 episodes
    python benchmarks/agent_turns.py --repeats 5 --turns 1 2 4 --threads 2

The episodes: the calc environment's prompt (a difficulty-3 word problem; with --tools also the tool instructions)
and an environment that answers every turn without a tool call with a fixed observation of about 30 tokens and never ends the episode, so every episode
takes exactly max_turns turns unless a turn runs into max_turn_tokens. A turn ends at the model's end of turn or at
its first sentence end (".", so turns stay short and many), seeded sampling at T = 1: both paths sample the same
episodes (the script checks the tokens are equal). The two paths are timed alternately (re-read, cached, re-read,
...) after one untimed warm-up each, so a machine shared with other work slows both alike. Prints, per turn count
and path, the median and the spread of `--repeats` timed runs, the speed-up of the medians, the load average, and
the tokens each path fed to the model in its prefills (a count that no load changes). Times are wall-clock and
the CPU time of the process (all its threads: on a machine shared with other work, waiting for a core is not
counted, so it is the steadier of the two).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

import grpolab.agents.episode as episode_module
from grpolab.agents.calc import make_problems
from grpolab.agents.env import AgentEnv, EpisodeLimits
from grpolab.agents.episode import EpisodeRunner
from grpolab.agents.tools import CALCULATOR
from grpolab.models.load import load_causal_lm, load_tokenizer, resolve_model_path
from grpolab.rollout.base import SamplingParams
from grpolab.rollout.grpolab_engine import eos_ids
from grpolab.tasks.base import Problem

OBSERVATION = (
    "calculator result: 7342. Keep going: check the numbers of the question once more and say what "
    "you would compute next."
)


class Endless(AgentEnv):
    def reset(self, problem: Problem, rng) -> str:
        return f"{problem.question}\n{problem.instruction}"

    def step(self, action: str) -> tuple[str, bool]:
        return OBSERVATION, False

    def reward(self) -> float:
        return 0.0


def run_once(
    runner: EpisodeRunner, problems: list[Problem], group: int
) -> tuple[tuple[float, float], list, list[int], int]:
    """((wall seconds, CPU seconds of this process), completion ids, turns per episode, tokens fed in prefills: rows x
    width of each multi-token forward)"""
    fed = [0]

    def count(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            fed[0] += ids.numel()

    handle = runner.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        out = runner.run(
            problems, group, SamplingParams(group_size=group, temperature=1.0), seeds=list(range(len(problems)))
        )
        elapsed = time.perf_counter() - start, time.process_time() - cpu
    finally:
        handle.remove()
    return elapsed, out.rollout.completion_ids.tolist(), [r.turns for r in out.results], fed[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bundled:smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--problems", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--turns", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--turn-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--tools",
        action="store_true",
        help="offer the calculator: the prompt carries the tool "
        "instructions (about twice as long), as an agent task's does",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    model, tok = load_causal_lm(path, args.dtype), load_tokenizer(path)
    sentence_ends = [i for t, i in tok.get_vocab().items() if t.rstrip() in (".", "Ġ.")]
    stops = sorted(set(eos_ids(model, tok) + sentence_ends))
    Endless.tools = [CALCULATOR] if args.tools else []
    episode_module.load_env = lambda ref: Endless  # the benchmark's environment, whatever the problem names
    calc = make_problems("test", args.problems, 0, 3)
    print(
        f"model {args.model} {args.dtype}, {args.threads} threads, {args.problems} x {args.group_size} episodes, "
        f"{args.turn_tokens} tokens a turn at most, {args.repeats} repeats (median [min, max])"
    )
    for turns in args.turns:
        limits = dataclasses.asdict(EpisodeLimits(turns, args.turn_tokens, 2048, 10.0))
        problems = [dataclasses.replace(p, data={"kind": "agent", "env": "endless", "limits": limits}) for p in calc]
        runners = {reuse: EpisodeRunner(model, tok, stops, reuse_cache=reuse) for reuse in (False, True)}
        outputs = {reuse: run_once(runners[reuse], problems, args.group_size) for reuse in (False, True)}  # warm-up
        times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.repeats):
            for reuse in (False, True):
                times[reuse].append(run_once(runners[reuse], problems, args.group_size)[0])
        same = outputs[False][1] == outputs[True][1]
        done = outputs[True][2]
        for reuse in (False, True):
            wall, cpu = [t[0] for t in times[reuse]], [t[1] for t in times[reuse]]
            print(
                f"turns={turns} {'kv-cache' if reuse else 're-read '}: wall {statistics.median(wall):7.2f} s "
                f"[{min(wall):.2f}, {max(wall):.2f}], CPU {statistics.median(cpu):7.2f} s [{min(cpu):.2f}, "
                f"{max(cpu):.2f}], prefill tokens {outputs[reuse][3]}"
            )
        ratio = [
            statistics.median([t[k] for t in times[False]]) / statistics.median([t[k] for t in times[True]])
            for k in (0, 1)
        ]
        print(
            f"turns={turns} speed-up wall {ratio[0]:.2f}x, CPU {ratio[1]:.2f}x; episodes reaching {turns} turns: "
            f"{sum(t == turns for t in done)}/{len(done)}; same tokens: {same}; load average {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
