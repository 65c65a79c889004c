#!/usr/bin/env python
"""Sampler/trainer mismatch and rollout time: vLLM vs grpolab's own decoder, on the quickstart's rollout batch.

    make install-vllm                                   # vLLM's own environment (docs/vllm.md)
    python benchmarks/vllm_mismatch.py                  # bundled SmolLM2-135M-Instruct, fp32, 3 rounds
    python benchmarks/vllm_mismatch.py --engine-dtype bf16 --rounds 5 --json-out vllm.json

One rollout batch is the quickstart's (configs/quickstart.yaml): 4 arithmetic prompts rendered with the chat
template, G = 8 completions each, up to 48 new tokens, temperature 0.8, no top-k / top-p. Each round samples it
with vLLM (rollout/vllm_engine.py, its worker in vLLM's environment) and with grpolab's decoder (rollout/grpolab_engine.py),
the same per-group seeds for both (the two engines draw different tokens from the same seed: their random
streams differ). For every sampled token the trainer's log-probability is a teacher-forced fp32 forward of the
policy over prompt + completion, log softmax(logits / T)(o_t) (what the update computes), and per engine:

    mean |d|, max |d|     d = log pi_trainer(o_t) - log q_sampler(o_t) over the completion tokens
    k3                    mean of exp(d) - d - 1: the k3 estimate of KL(q || pi_trainer) (the tokens come from q)
    outside [0.5, 2]      the share of tokens whose IS weight exp(d) the default truncation (is_c_min / is_c_max)
                          would clip or mask

Timing: wall seconds of each engine's generate for the whole batch (median over rounds, after one uncounted
warm-up batch each; rounds alternate the order), vLLM's start-up separately, and one weight sync's bytes and
seconds. Run it on an idle machine for a speed claim; the machine and its load are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from grpolab.algo.logprobs import token_logprobs
from grpolab.models.load import load_causal_lm, load_tokenizer, resolve_model_path
from grpolab.rollout.base import SamplingParams
from grpolab.rollout.grpolab_engine import GrpolabEngine
from grpolab.rollout.vllm_engine import VLLMEngine
from grpolab.tasks import make_task
from grpolab.tasks.prompting import prompt_ids

QUICKSTART_TASK = dict(max_operand=20, operators="+-", terms=2, seed=0, test_fraction=0.3, num_test=300)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def trainer_logprobs(policy, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """log softmax(logits / T)(o_t) of an fp32 teacher-forced forward over prompt + completion (one row, no pads)."""
    device = next(policy.parameters()).device
    with torch.no_grad():
        logits = policy(torch.tensor([prompt + completion], device=device)).logits[0, len(prompt) - 1 : -1]
    return token_logprobs(logits, torch.tensor(completion, device=device), temperature).double().cpu()


def mismatch(policy, prompts: list[list[int]], rollout, g: int, temperature: float) -> dict[str, float]:
    diffs = []
    for i in range(len(rollout)):
        n = int(rollout.completion_mask[i].sum())
        comp = rollout.completion_ids[i, :n].tolist()
        sampler = rollout.sampler_logprobs[i, :n].double().cpu()
        diffs.append(trainer_logprobs(policy, prompts[i // g], comp, temperature) - sampler)
    d = torch.cat(diffs)
    w = d.exp()
    return {
        "tokens": int(d.numel()),
        "mean_abs": d.abs().mean().item(),
        "max_abs": d.abs().max().item(),
        "k3": (w - d - 1).mean().item(),
        "frac_outside_is_bounds": ((w < 0.5) | (w > 2.0)).double().mean().item(),
    }


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def timed(fn):
    began = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--engine-dtype", choices=sorted(DTYPES), default="fp32", help="vLLM's weights and compute")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--device", default="cpu", help="the trainer's policy and grpolab's decoder (cuda on a GPU)")
    args = parser.parse_args()

    path = resolve_model_path(args.model)
    tok, policy = load_tokenizer(path), load_causal_lm(path, "float32").eval().to(args.device)
    problems = make_task("arithmetic", **QUICKSTART_TASK).problems("train")
    params = SamplingParams(
        group_size=args.group_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature
    )
    ours = GrpolabEngine(policy, tok, torch.float32)

    vllm, start_s = timed(lambda: VLLMEngine(policy, tok, DTYPES[args.engine_dtype], max_model_len=1024))
    try:
        vllm.sync_weights(policy)
        sync = dict(vllm.last_sync)
        warm = [prompt_ids(tok, p) for p in problems[-args.prompts :]]  # one batch each first, not counted
        for engine in (vllm, ours):
            engine.generate(warm, params, seeds=list(range(len(warm))))
        times: dict[str, list[float]] = {"vllm": [], "grpolab": []}
        stats: dict[str, list[dict]] = {"vllm": [], "grpolab": []}
        for r in range(args.rounds):
            batch = problems[r * args.prompts : (r + 1) * args.prompts]
            prompts = [prompt_ids(tok, p) for p in batch]
            seeds = [1000 * r + i for i in range(len(prompts))]
            order = [("vllm", vllm), ("grpolab", ours)]
            for name, engine in order if r % 2 == 0 else order[::-1]:
                rollout, seconds = timed(lambda: engine.generate(prompts, params, seeds=seeds))
                times[name].append(seconds)
                stats[name].append(mismatch(policy, prompts, rollout, args.group_size, args.temperature))
                print(f"round {r} {name:8s} {seconds:6.2f} s  {stats[name][-1]}", flush=True)
    finally:
        vllm.close()

    def pooled(rows: list[dict]) -> dict[str, float]:
        n = sum(s["tokens"] for s in rows)
        out = {k: sum(s[k] * s["tokens"] for s in rows) / n for k in ("mean_abs", "k3", "frac_outside_is_bounds")}
        return {"tokens": n, **out, "max_abs": max(s["max_abs"] for s in rows)}

    result = {
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
        "engine": f"vLLM {vllm.version} ({args.engine_dtype})",
        "trainer": "fp32 teacher-forced forward",
        "batch": f"{args.prompts} prompts x G={args.group_size}, max_new_tokens={args.max_new_tokens}, "
        f"T={args.temperature}",
        "vllm_start_s": start_s,
        "weight_sync": sync,
        "mismatch": {name: pooled(rows) for name, rows in stats.items()},
        "rollout_s_median": {name: statistics.median(ts) for name, ts in times.items()},
    }
    result["rollout_ratio_vllm_over_grpolab"] = (
        result["rollout_s_median"]["vllm"] / result["rollout_s_median"]["grpolab"]
    )
    print(json.dumps(result, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":  # vLLM's worker is a process of its own; the guard keeps imports of this file inert
    main()
