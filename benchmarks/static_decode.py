#!/usr/bin/env python
"""The fixed-shape decode step (`rollout.decoder: static`) against grpolab's default decode loop, same run.

    python benchmarks/static_decode.py                       # bundled SmolLM2-135M-Instruct, G = 8, fp32
    python benchmarks/static_decode.py --compile             # also the compiled step (static_compiled)
    python benchmarks/static_decode.py --dtype bfloat16      # the bf16 sampler copy (rollout.dtype: bfloat16)
    python benchmarks/static_decode.py --dtype bfloat16 --with-fp32   # ... and the fp32 default loop, alternated

Each side samples G completions of one fixed prompt with no stop token (every row runs every step). The time of a
step is the difference of two whole calls, `new_tokens` and `short_tokens` long, over the steps between them, so
the prefill and per-call set-up cancel:

    step = (T(new_tokens) - T(short_tokens)) / (new_tokens - short_tokens)

The sides are timed alternately, `repeats` rounds, median per side, so a shared machine's drift hits both alike.
The floor is decode_floor.py's: the bytes a step must read over the measured streaming read rate. The compiled
side's first call (compilation) is timed apart and printed.
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
from decode_floor import read_bandwidth, step_bytes  # noqa: E402


def call_seconds(decode, model, prompt: torch.Tensor, group_size: int, new_tokens: int) -> float:
    """Seconds of one whole decode call of `new_tokens` tokens, no stop token, one seeded generator."""
    mask = torch.ones_like(prompt)
    gens = [torch.Generator().manual_seed(0)]
    t0 = time.perf_counter()
    decode(model, prompt, mask, group_size, new_tokens, 1.0, stop_ids=[], pad_id=0, generators=gens)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bundled:smollm2-135m-instruct")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--short-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also time the compiled fixed-shape step")
    ap.add_argument("--with-fp32", action="store_true",
                    help="with --dtype bfloat16: also time the default loop on an fp32 copy, in the same rounds")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="precision of the sampling model (bf16: the rollout's bf16 copy); forced, never read from the machine")
    args = ap.parse_args()
    from grpolab.models.load import load_causal_lm, resolve_model_path
    from grpolab.rollout.decode import decode_groups
    from grpolab.rollout.static_decode import StaticDecoder

    dtype = getattr(torch, args.dtype)
    model = load_causal_lm(resolve_model_path(args.model), "float32").to(dtype).eval()
    prompt = torch.randint(100, 1000, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    sides = {"decode loop (default: rows leave, cache in place, prepacked)": (decode_groups, model),
             "fixed-shape step, eager (static)": (StaticDecoder().decode, model)}
    if args.with_fp32 and dtype != torch.float32:
        fp32_model = load_causal_lm(resolve_model_path(args.model), "float32").eval()
        sides["decode loop, fp32 weights (the other rollout.dtype; floor not its own)"] = (decode_groups, fp32_model)
    compile_s = None
    if args.compile:
        compiled = StaticDecoder(compile=True)
        t0 = time.perf_counter()
        call_seconds(compiled.decode, model, prompt, args.group_size, args.short_tokens)
        compile_s = time.perf_counter() - t0
        sides["fixed-shape step, compiled (static_compiled)"] = (compiled.decode, model)
    with torch.no_grad():
        for decode, m in sides.values():  # warm-up: allocations, the static cache of each shape
            for n in (args.short_tokens, args.new_tokens):
                call_seconds(decode, m, prompt, args.group_size, n)
        steps: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.repeats):
            for name, (decode, m) in sides.items():
                long = call_seconds(decode, m, prompt, args.group_size, args.new_tokens)
                short = call_seconds(decode, m, prompt, args.group_size, args.short_tokens)
                steps[name].append((long - short) / (args.new_tokens - args.short_tokens))
    ms = {name: statistics.median(times) * 1e3 for name, times in steps.items()}
    context = args.prompt_tokens + (args.new_tokens + args.short_tokens) / 2
    floor_ms = step_bytes(model, args.group_size, context, dtype) / read_bandwidth() * 1e3
    print(f"machine: {cpu_features()}  threads: {torch.get_num_threads()}  torch {torch.__version__}")
    print(f"model {args.model} ({args.dtype}), G = {args.group_size}, prompt {args.prompt_tokens} tokens, step = "
          f"(T({args.new_tokens}) - T({args.short_tokens})) / {args.new_tokens - args.short_tokens}, "
          f"median of {args.repeats} alternated rounds")
    if compile_s is not None:
        print(f"compiled side's first call (compilation + {args.short_tokens} tokens): {compile_s:.1f} s")
    base = ms[next(iter(sides))]
    print("| per decode step | ms | x floor | / default loop |")
    print("|---|---|---|---|")
    print(f"| floor (bytes / bandwidth) | {floor_ms:.1f} | 1.00 | |")
    for name, value in ms.items():
        print(f"| {name} | {value:.1f} | {value / floor_ms:.2f} | {value / base:.2f} |")


if __name__ == "__main__":
    main()
