"""How far a served model's answers are from grpolab's evaluation of the same checkpoint (pure functions on lists).

Per held-out problem i, r_i = the token ids grpolab's evaluation generated (greedy, its stop token included) and
s_i = the ids the served stack generated for the same prompt. The measures:

- identical share: (1/n) sum_i [s_i == r_i];
- first divergence position of a pair that differs: the first index t with s_i[t] != r_i[t], or the shorter
  length when one is a prefix of the other;
- mean |delta logprob| per token: both stacks score the *same* tokens r_i after the same prompt (teacher forcing),
  so D = sum_i sum_t |l^served_{i,t} - l^grpolab_{i,t}| / sum_i |r_i|, in nats per token; it is defined even where
  the greedy answers part, and is 0 only when the two stacks compute the same distribution on every token.
"""

from __future__ import annotations

import math
from statistics import median
from typing import Sequence


def first_divergence(reference: Sequence[int], served: Sequence[int]) -> int | None:
    """Index of the first token where two completions differ; None when they are identical.

    >>> first_divergence([5, 6, 7], [5, 6, 7]) is None, first_divergence([5, 6, 7], [5, 9, 7])
    (True, 1)
    >>> first_divergence([5, 6], [5, 6, 7, 8]), first_divergence([], [1])
    (2, 0)
    """
    for t, (a, b) in enumerate(zip(reference, served)):
        if a != b:
            return t
    return None if len(reference) == len(served) else min(len(reference), len(served))


def divergence_summary(references: Sequence[Sequence[int]], served: Sequence[Sequence[int]]) -> dict:
    """Identical share and, over the pairs that differ, the first divergence positions (min, median, max) and
    the index of each such pair.

    >>> s = divergence_summary([[1, 2], [3, 4], [5]], [[1, 2], [3, 9], [6]])
    >>> round(s["identical_share"], 4), s["diverged"], s["first_divergence"]
    (0.3333, [1, 2], {'min': 0, 'median': 0.5, 'max': 1})
    """
    if len(references) != len(served) or not references:
        raise ValueError(
            f"divergence_summary: need two equally long, non-empty lists, got {len(references)} and {len(served)}"
        )
    positions = [first_divergence(r, s) for r, s in zip(references, served)]
    diverged = [i for i, p in enumerate(positions) if p is not None]
    at = [positions[i] for i in diverged]
    return {
        "n": len(references),
        "identical_share": 1 - len(diverged) / len(references),
        "diverged": diverged,
        "first_divergence": {"min": min(at), "median": median(at), "max": max(at)} if at else None,
    }


def mean_abs_logprob_diff(reference: Sequence[Sequence[float]], served: Sequence[Sequence[float]]) -> dict:
    """D = sum |l_served - l_reference| / tokens over every token of every pair (module docstring), and the largest
    single |difference|; pairs must have equal lengths (the same tokens scored twice).

    >>> mean_abs_logprob_diff([[-1.0, -2.0], [-0.5]], [[-1.5, -2.0], [-0.25]])
    {'mean': 0.25, 'max': 0.5, 'tokens': 3}
    """
    total, worst, tokens = 0.0, 0.0, 0
    for i, (r, s) in enumerate(zip(reference, served, strict=True)):
        if len(r) != len(s):
            raise ValueError(
                f"mean_abs_logprob_diff: pair {i} scores {len(r)} and {len(s)} tokens; expected the same tokens"
            )
        for a, b in zip(r, s):
            d = abs(b - a)
            total, worst, tokens = total + d, max(worst, d), tokens + 1
    return {"mean": total / tokens if tokens else math.nan, "max": worst, "tokens": tokens}
