#!/usr/bin/env python
"""Where a trained model's greedy answers part from the base model's, and by how much each model preferred which token.

    python benchmarks/greedy_flips.py runs/code-quickstart/eval/base_vs_trained.json

Reads an evaluation JSON of `grpolab eval BASE RUN ...` (the first two models), and for every held-out problem whose
greedy verdict differs between them finds the first token where the two greedy completions differ, then prints
both models' probabilities of both tokens in that shared context (one forward pass each, float32). The JSON keeps
the completions' text, not their ids, so the answers are re-tokenized: the context is the text's tokenization.

    p_base(base token) / p_base(trained token)   and   p_trained(base token) / p_trained(trained token)

A base probability near 0.5 on its own token is a greedy decision with a small margin, the kind training can flip
without ever being rewarded for it on that problem. The summary counts flips per slice (family) and the median base
margin p(base token) - p(trained token) of the flips that lost a pass.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

import torch

from grpolab.evaluation.heldout import load_eval_problems
from grpolab.models.load import load_causal_lm, load_tokenizer, resolve_model_path
from grpolab.tasks.prompting import prompt_ids


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where both token lists hold a token and the tokens differ; None if one is a prefix of the
    other (no token to compare there)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@torch.no_grad()
def next_token_probs(model, ids: list[int]) -> torch.Tensor:
    return torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("eval_json", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    record = json.loads(args.eval_json.read_text(encoding="utf-8"))
    first, second = record["models"][:2]
    problems = {p.uid: p for p in load_eval_problems(record["task"], record["task_options"], record["split"], 0)}
    paths = [resolve_model_path(m["model"]) for m in (first, second)]
    tokenizer = load_tokenizer(paths[0])
    models = [load_causal_lm(p, "float32").eval() for p in paths]
    other = {item["uid"]: item for item in second["items"]}
    flips, lost_margins = Counter(), []
    for item in first["items"]:
        mate = other[item["uid"]]
        if item["correct"] == mate["correct"]:
            continue
        direction = "lost" if item["correct"] else "gained"
        flips[(item["slice"], direction)] += 1
        a = tokenizer(item["completion"], add_special_tokens=False)["input_ids"]
        b = tokenizer(mate["completion"], add_special_tokens=False)["input_ids"]
        i = first_difference(a, b)
        if i is None:
            print(f"{item['uid']:30s} {direction:6s} one greedy answer is a prefix of the other")
            continue
        context = prompt_ids(tokenizer, problems[item["uid"]]) + a[:i]
        pb, pt = (next_token_probs(m, context) for m in models)
        if direction == "lost":
            lost_margins.append(float(pb[a[i]] - pb[b[i]]))
        print(
            f"{item['uid']:30s} {direction:6s} after {tokenizer.decode(a[max(0, i - 4) : i])!r}: "
            f"{tokenizer.decode([a[i]])!r} vs {tokenizer.decode([b[i]])!r} | base {pb[a[i]]:.2f}/{pb[b[i]]:.2f} "
            f"trained {pt[a[i]]:.2f}/{pt[b[i]]:.2f}"
        )
    print("flips per slice:", dict(sorted(flips.items())))
    if lost_margins:
        print(
            f"passes lost: {len(lost_margins)}, median base margin p(base token) - p(trained token) "
            f"{statistics.median(lost_margins):.2f} (min {min(lost_margins):.2f}, max {max(lost_margins):.2f})"
        )


if __name__ == "__main__":
    main()
