"""Weight syncs into a vLLM server through vLLM's weight-transfer API (rollout.engine vllm_server; docs/vllm.md):
seconds against bytes, and whether the server then computes with the trainer's new weights.

    python benchmarks/vllm_server_sync.py                          # grpolab starts the server (untied config)
    python benchmarks/vllm_server_sync.py --url http://127.0.0.1:8000   # a server you started (docs/vllm.md)
    python benchmarks/vllm_server_sync.py --dtype bf16 --syncs 5

The model is the bundled SmolLM2-135M-Instruct (its embeddings tied). Before the timed syncs, every weight of the
policy is perturbed by 1% of its own standard deviation and synced once: the server's teacher-forced logprobs of a
fixed sequence must then equal the perturbed model's (an fp32 forward here) and differ from the original's. Each
timed sync sends the whole model (the embedding under both of its names); the figures are the per-server seconds
(start_weight_update .. finish_weight_update) and bytes of ``engine.last_sync``, median over --syncs.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import subprocess

import torch

from grpolab.algo.logprobs import token_logprobs
from grpolab.models.load import load_causal_lm, load_tokenizer, resolve_model_path
from grpolab.rollout.server_engine import VLLMServerEngine

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        line = next(ln for ln in out.splitlines() if ln.startswith("Model name"))
        return line.split(":", 1)[1].strip()
    except (OSError, StopIteration, subprocess.SubprocessError):
        return platform.processor() or "unknown"


def perturbed(model: torch.nn.Module, scale: float = 0.01) -> torch.nn.Module:
    other = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * p.float().std().clamp(min=1e-6) * scale)
    return other


def max_diff(engine: VLLMServerEngine, model: torch.nn.Module, seq: list[int]) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0, :-1].double()
    want = token_logprobs(logits, torch.tensor(seq[1:]))
    return (engine.score([seq], server=0)[0].double() - want).abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="", help="a running server (default: grpolab starts one)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    args = parser.parse_args()
    path = resolve_model_path(args.model)
    tok, policy = load_tokenizer(path), load_causal_lm(path).eval()
    engine = VLLMServerEngine(
        policy, tok, DTYPES[args.dtype], servers=[args.url] if args.url else [], max_model_len=1024, call_timeout=600.0
    )
    try:
        chat = [{"role": "user", "content": "What is 7 + 5?"}]
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) + "7 + 5 = 12."
        seq = tok.encode(text, add_special_tokens=False)
        other = perturbed(policy)
        engine.sync_weights(other)
        check = {"diff_to_new": max_diff(engine, other, seq), "diff_to_old": max_diff(engine, policy, seq)}
        seconds, sizes = [], []
        for i in range(args.syncs):
            engine.sync_weights(other if i % 2 else policy)
            seconds.append(engine.last_sync["server/0/s"])
            sizes.append(engine.last_sync["server/0/bytes"])
        result = {
            "cpu": cpu_model(),
            "vllm": engine.version,
            "server": engine.urls[0] + ("" if args.url else " (started by grpolab)"),
            "dtype": args.dtype,
            "bytes_per_sync": statistics.median(sizes),
            "sync_s_median": statistics.median(seconds),
            "sync_s": [round(s, 3) for s in seconds],
            "mb_per_s": statistics.median(sizes) / statistics.median(seconds) / 1e6,
            **check,
        }
        print(json.dumps(result, indent=2))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
