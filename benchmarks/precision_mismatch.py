#!/usr/bin/env python
"""Sampler/trainer mismatch by precision: grpolab's sampler in fp32, bf16 and fp16 against the trainer's pass in
fp32, bf16 and fp16, on the same batch of prompts.

    python benchmarks/precision_mismatch.py --gsm8k DIR      # DIR holds GSM8K's test.jsonl; without it: the hub
    python benchmarks/precision_mismatch.py --prompts 4 --max-new-tokens 32 --json-out mismatch.json

The batch: the first --prompts GSM8K test questions rendered with the chat template of the bundled
SmolLM2-135M-Instruct, --group-size completions each, up to --max-new-tokens new tokens at temperature 1. For each
sampler precision P (rollout.dtype: the sampler's own weight copy in float32 / bfloat16 / float16, grpolab's decode
loop, rollout/grpolab_engine.py) the same per-group seeds sample the batch; each sampled batch is then scored by
the trainer's own pass (training/forward.py completion_logprobs: shared prompt, packed completions, fp32 master
weights under train.precision's autocast) in fp32, bf16 and fp16. Per (sampler, trainer) pair, over the completion
tokens, with d = log pi_trainer(o_t) - log q_sampler(o_t):

    k3        mean(exp(d) - 1 - d): the training metric sampler/kl_k3 (grpolab.algo.importance.correction_stats)
    max |d|   the largest per-token log-probability difference; mean |d| beside it

Printed with the CPU's model name and whether it has bf16 / fp16 units; wall seconds of each sampling and scoring
(not a speed claim on a shared machine: they show what the slower precisions cost where a CPU lacks their units).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from grpolab.algo.importance import correction_stats
from grpolab.models.load import load_causal_lm, load_tokenizer, resolve_model_path
from grpolab.rollout.base import Rollout, SamplingParams
from grpolab.rollout.grpolab_engine import GrpolabEngine
from grpolab.rollout.prepack import cpu_has_bf16_units
from grpolab.tasks import make_task
from grpolab.tasks.prompting import prompt_ids
from grpolab.training.forward import completion_logprobs, weight_casts_kept
from grpolab.training.precision import cpu_has_fp16_units, cpu_name

SAMPLER = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # rollout.dtype per precision
DEFAULT_GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"  # beside the checkout, if there


def prompts(tok, path: str | None, n: int) -> list[list[int]]:
    """The first n GSM8K test questions as chat-template token ids (from path/test.jsonl, or the hub)."""
    options = {"path": path} if path else {}
    return [prompt_ids(tok, p) for p in make_task("gsm8k", **options).problems("test")[:n]]


def sample(policy, tok, batch: list[list[int]], precision: str, params: SamplingParams) -> tuple[Rollout, float]:
    """The batch sampled by a sampler whose weights are `precision`'s dtype (seeds 0..n-1: the same for every P)."""
    engine = GrpolabEngine(policy, tok, SAMPLER[precision])
    began = time.perf_counter()
    out = engine.generate(batch, params, seeds=list(range(len(batch))))
    return out, time.perf_counter() - began


@torch.no_grad()
def score(policy, rollout: Rollout, precision: str, temperature: float, micro: int) -> tuple[torch.Tensor, float]:
    """[N, Lc] log pi(o_t) / T of the trainer's pass in `precision`, micro-batch by micro-batch (as the update)."""
    out = torch.zeros(rollout.completion_ids.shape)
    began = time.perf_counter()
    with weight_casts_kept(precision):
        for rows in torch.arange(len(rollout)).split(micro):
            fo = completion_logprobs(policy, rollout, rows, temperature, precision, share_prompt=True, pack=True)
            out[rows, fo.cols] = fo.logp.float()
    return out, time.perf_counter() - began


def mismatch(trainer: torch.Tensor, rollout: Rollout) -> dict[str, float]:
    """k3 (= sampler/kl_k3), max |d| and mean |d| over the completion tokens, d = trainer - sampler logprob."""
    sel = rollout.completion_mask.bool()
    d = (trainer.double() - rollout.untruncated_logprobs().double())[sel]
    none, empty = torch.zeros_like(d, dtype=torch.bool), torch.zeros(0, dtype=torch.bool)
    k3 = correction_stats(d, none, none, none, empty, empty, empty)["sampler/kl_k3"]
    return {"tokens": int(d.numel()), "k3": k3, "max_abs": d.abs().max().item(), "mean_abs": d.abs().mean().item()}


def table(result: dict) -> str:
    """The pairs as a markdown table (what docs/performance.md shows)."""
    lines = ["| sampler | trainer | k3 (sampler/kl_k3) | max abs d | mean abs d |", "|---|---|---|---|---|"]
    for r in result["pairs"]:
        lines.append(f"| {r['sampler']} | {r['trainer']} | {r['k3']:.2e} | {r['max_abs']:.3f} | {r['mean_abs']:.4f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--gsm8k", default=str(DEFAULT_GSM8K) if DEFAULT_GSM8K.is_dir() else None)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per trainer pass (train.micro_batch_size)")
    parser.add_argument("--samplers", default="fp32,bf16,fp16")
    parser.add_argument("--trainers", default="fp32,bf16,fp16")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()

    path = resolve_model_path(args.model)
    tok, policy = load_tokenizer(path), load_causal_lm(path, "float32").eval()
    batch = prompts(tok, args.gsm8k, args.prompts)
    params = SamplingParams(
        group_size=args.group_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature
    )
    machine = (
        f"{cpu_name()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, bf16 units: "
        f"{cpu_has_bf16_units()}, fp16 units: {cpu_has_fp16_units()}"
    )
    print(machine, flush=True)
    pairs, seconds = [], {}
    for s in args.samplers.split(","):
        rollout, seconds[f"sample {s}"] = sample(policy, tok, batch, s, params)
        for t in args.trainers.split(","):
            logp, seconds[f"score {s} sample by {t} trainer"] = score(
                policy, rollout, t, args.temperature, args.micro_batch
            )
            pairs.append({"sampler": s, "trainer": t, **mismatch(logp, rollout)})
            print(json.dumps(pairs[-1]), flush=True)
    result = {
        "machine": machine,
        "load_average_at_end": os.getloadavg()[0],
        "torch": torch.__version__,
        "batch": f"{len(batch)} GSM8K test prompts x G={args.group_size}, max_new_tokens={args.max_new_tokens}, "
        f"T={args.temperature}, model {args.model}",
        "pairs": pairs,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }
    print(table(result))
    print(json.dumps(result["seconds"], indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
