#!/usr/bin/env python
"""The decode step against its memory floor: how far grpolab's sampling is from reading the weights once per token.

    python benchmarks/decode_floor.py                      # bundled SmolLM2-135M-Instruct, G = 8, fp32
    python benchmarks/decode_floor.py --dtype bfloat16 --group-size 8 --new-tokens 256

A decode step of G rows must read every weight once (the LM head included) and each row's key/value cache:

    bytes(step at context c) = bytes(weights) + n_layers * 2 * G * c * n_kv_heads * head_dim * bytes(element)

and cannot be faster than bytes / bandwidth, the bandwidth being this machine's measured streaming read rate (the
best of several sums over a buffer far larger than the last-level cache). The script measures, on one fixed
prompt, with no row allowed to stop (so every step has G rows):

  products      the step's linear products alone (every nn.Linear, LM head included, on G rows, weights
                prepacked): what this machine's product kernel makes of the weight bytes, nothing else running
  model step    the model's forward for one new token of G rows, KV cache in place (what the floor bounds)
  decode step   grpolab's whole step (rollout/decode.py): forward + sampling + bookkeeping, with its levers off,
                then each added in turn: the linear layers' weights packed once per decode call (prepack.py), the
                KV cache grown in place instead of concatenated (cache.py); both on is the default

and prints each against the floor at the mean context. It imports grpolab only for the decode loop and the model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import cpu_features  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# decode-step variants timed, as decode_groups keyword arguments (each lever added to the one before)
VARIANTS = {
    "weights as they are, cache by concatenation": {"prepack": False, "preallocate_cache": False},
    "prepacked weights": {"prepack": True, "preallocate_cache": False},
    "prepacked weights + cache grown in place (default)": {"prepack": True, "preallocate_cache": True},
}


def read_bandwidth(megabytes: int = 1024, repeats: int = 7) -> float:
    """Streaming read rate in bytes/s: the best of `repeats` sums over a float32 buffer of `megabytes`."""
    x = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32)
    x.sum()  # fault the pages in
    best = min(_timed(lambda: x.sum()) for _ in range(repeats))
    return x.numel() * 4 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def step_bytes(model: torch.nn.Module, group_size: int, context: float, dtype: torch.dtype) -> float:
    """Bytes one decode step must read at this context: every parameter once (tied ones once) + the KV cache."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    n_kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    element = torch.finfo(dtype).bits // 8
    weights = sum(p.numel() for p in model.parameters()) * element  # parameters() yields a tied tensor once
    kv = c.num_hidden_layers * 2 * group_size * context * n_kv * head_dim * element
    return weights + kv


def model_step_seconds(model, prompt_ids: torch.Tensor, group_size: int, new_tokens: int) -> list[float]:
    """Seconds of each incremental forward of G rows (fixed next token, KV cache growing), after one prefill."""
    from grpolab.rollout.cache import cache_kwarg

    ids = prompt_ids.repeat(group_size, 1)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache, times = getattr(out, "cache", None) or out.past_key_values, []
        tok = ids[:, -1:]
        for _ in range(new_tokens - 1):
            t0 = time.perf_counter()
            model(input_ids=tok, use_cache=True, **cache_kwarg(model, cache))  # the cache grows in place
            times.append(time.perf_counter() - t0)
    return times


def products_seconds(model, rows: int, repeats: int = 5) -> float:
    """Seconds of a step's linear products alone: every nn.Linear of the model (the LM head included) applied in
    turn to `rows` rows, with its weight prepacked as the decode loop has it; nothing else of the model runs. The
    weights (hundreds of MB) come from memory, as in a real step: the best this machine's product kernel does."""
    from grpolab.rollout.prepack import prepacked_linears

    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    inputs = [torch.randn(rows, m.in_features, dtype=m.weight.dtype) for m in linears]
    with torch.no_grad(), prepacked_linears(model, rows):
        return min(_timed(lambda: [m(x) for m, x in zip(linears, inputs)]) for _ in range(repeats))


def decode_step_seconds(model, prompt_ids: torch.Tensor, group_size: int, new_tokens: int, levers: dict) -> float:
    """Mean seconds per step of grpolab's decode loop with no stop token (all G rows run every step)."""
    from grpolab.rollout.decode import decode_groups

    mask = torch.ones_like(prompt_ids)
    gens = [torch.Generator().manual_seed(0)]
    t0 = time.perf_counter()
    with torch.no_grad():
        model(input_ids=prompt_ids, use_cache=True)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    decode_groups(
        model, prompt_ids, mask, group_size, new_tokens, 1.0, stop_ids=[], pad_id=0, generators=gens, **levers
    )
    return (time.perf_counter() - t0 - prefill) / (new_tokens - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bundled:smollm2-135m-instruct")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from grpolab.models.load import load_causal_lm, resolve_model_path

    dtype = DTYPES[args.dtype]
    model = load_causal_lm(resolve_model_path(args.model), args.dtype).eval()
    prompt = torch.randint(100, 1000, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    bandwidth = read_bandwidth()
    model_step_seconds(model, prompt, args.group_size, 8)  # warm-up
    model_steps = statistics.median(
        statistics.mean(model_step_seconds(model, prompt, args.group_size, args.new_tokens))
        for _ in range(args.repeats)
    )
    products = products_seconds(model, args.group_size)
    steps = {variant: [] for variant in VARIANTS}
    for _ in range(args.repeats):  # alternated, so drift of a shared machine hits both alike
        for variant, levers in VARIANTS.items():
            steps[variant].append(decode_step_seconds(model, prompt, args.group_size, args.new_tokens, levers))
    step_ms = {variant: statistics.median(times) * 1e3 for variant, times in steps.items()}
    context = args.prompt_tokens + args.new_tokens / 2
    floor = step_bytes(model, args.group_size, context, dtype) / bandwidth
    print(f"machine: {cpu_features()}  threads: {torch.get_num_threads()}  torch {torch.__version__}")
    print(
        f"model {args.model} ({args.dtype}), G = {args.group_size}, prompt {args.prompt_tokens} tokens, "
        f"{args.new_tokens} new tokens (mean context {context:.0f})"
    )
    print(
        f"read bandwidth {bandwidth / 1e9:.1f} GB/s; a step reads {step_bytes(model, args.group_size, context, dtype) / 1e6:.0f} MB "
        f"-> floor {floor * 1e3:.1f} ms"
    )
    print("| per decode step | ms | x floor |")
    print("|---|---|---|")
    print(f"| floor (bytes / bandwidth) | {floor * 1e3:.1f} | 1.00 |")
    print(f"| the step's linear products alone (prepacked, G rows) | {products * 1e3:.1f} | {products / floor:.2f} |")
    print(f"| model forward (G rows, KV cache) | {model_steps * 1e3:.1f} | {model_steps / floor:.2f} |")
    for variant, ms in step_ms.items():
        print(f"| grpolab decode step, {variant} | {ms:.1f} | {ms / (floor * 1e3):.2f} |")
    plain = step_ms[next(iter(VARIANTS))]
    print(
        f"each variant / {next(iter(VARIANTS))}: " + ", ".join(f"{v}: {ms / plain:.2f}x" for v, ms in step_ms.items())
    )


if __name__ == "__main__":
    main()
