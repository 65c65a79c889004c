"""LoRA on a vLLM server: the adapter-only sync (rollout.lora_sync: adapter) against the merged one, in one run.

    python benchmarks/lora_sync.py                      # SmolLM2-135M-Instruct, rank 16 on every linear layer
    python benchmarks/lora_sync.py --rank 64 --syncs 5

For each mode grpolab starts one `vllm serve` (fp32 on a CPU) of the bundled model with LoRA adapters (peft,
all-linear), then --syncs times: every adapter tensor redrawn (B != 0), one sync, one generation of 8 prompts x 4
completions x up to 64 tokens (temperature 0.8, fixed seeds). Printed per mode: bytes and seconds per sync (median
of engine.last_sync's), generation seconds (median), whether the server then scores a fixed sequence as the merged
model (max |diff| of the teacher-forced log-probabilities, fp32), and the ratios adapter / merged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from vllm_server_sync import cpu_model

from grpolab.algo.logprobs import token_logprobs
from grpolab.models.load import load_causal_lm, load_tokenizer, resolve_model_path
from grpolab.rollout.base import SamplingParams
from grpolab.rollout.server_engine import VLLMServerEngine


def chat_text(tok, question: str) -> str:
    return tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)


def lora_policy(path: str, rank: int):
    import peft

    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM")
    return peft.get_peft_model(load_causal_lm(path).eval(), config)


def redraw(policy, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def merged_diff(engine: VLLMServerEngine, policy, seq: list[int]) -> float:
    with torch.no_grad():
        logits = policy(torch.tensor([seq])).logits[0, :-1].double()
    want = token_logprobs(logits, torch.tensor(seq[1:]))
    return (engine.score([seq], server=0)[0].double() - want).abs().max().item()


def measure(mode: str, path: str, tok, rank: int, syncs: int, prompts: list[list[int]], seq: list[int]) -> dict:
    policy = lora_policy(path, rank)
    began = time.perf_counter()
    engine = VLLMServerEngine(policy, tok, torch.float32, num_servers=1, max_model_len=1024, lora_sync=mode)
    start_s = time.perf_counter() - began
    params = SamplingParams(group_size=4, max_new_tokens=64, temperature=0.8)
    seconds, sizes, generation, diffs = [], [], [], []
    try:
        for i in range(syncs):
            redraw(policy, seed=i)
            engine.sync_weights(policy)
            seconds.append(engine.last_sync["server/0/s"])
            sizes.append(engine.last_sync["server/0/bytes"])
            t = time.perf_counter()
            engine.generate(prompts, params, seeds=list(range(len(prompts))))
            generation.append(time.perf_counter() - t)
            diffs.append(merged_diff(engine, policy, seq))
    finally:
        engine.close()
    return {
        "start_s": round(start_s, 1),
        "bytes_per_sync": statistics.median(sizes),
        "sync_s_median": statistics.median(seconds),
        "sync_s": [round(s, 3) for s in seconds],
        "generation_s_median": statistics.median(generation),
        "max_diff_to_merged": max(diffs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    args = parser.parse_args()
    path = resolve_model_path(args.model)
    tok = load_tokenizer(path)
    questions = [
        f"What is {a} + {b}?" for a, b in ((7, 5), (12, 30), (3, 9), (45, 8), (1, 1), (60, 7), (2, 88), (9, 9))
    ]
    prompts = [tok.encode(chat_text(tok, q), add_special_tokens=False) for q in questions]
    seq = prompts[0] + tok.encode("7 + 5 = 12.", add_special_tokens=False)
    result = {"cpu": cpu_model(), "model": args.model, "rank": args.rank, "dtype": "fp32"}
    for mode in ("merged", "adapter"):
        result[mode] = measure(mode, path, tok, args.rank, args.syncs, prompts, seq)
    for key in ("bytes_per_sync", "sync_s_median", "generation_s_median"):
        result[f"adapter/merged {key}"] = round(result["adapter"][key] / result["merged"][key], 4)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
