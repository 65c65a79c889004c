"""Policy/reference forward passes over rollout rows: per-token logprobs (and entropy) of completion tokens only.

The sequence is [left-padded prompt | right-padded completion]. Position ids restart at each row's first real
token, as `generate` does, so training logprobs match the sampler's. Logits are computed only for the
completion positions (`logits_to_keep`), never for the prompt.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .algo.logprobs import entropy_from_logits, token_logprobs
from .rollout.base import Rollout


@dataclass
class ForwardOut:
    logp: torch.Tensor  # [b, Lc] float32
    entropy: torch.Tensor | None  # [b, Lc] float32, detached unless entropy_grad
    mask: torch.Tensor  # [b, Lc] completion mask, trimmed like logp
    cols: slice  # which completion columns of the rollout these cover


def autocast(precision: str):
    """bf16 autocast over fp32 master weights, or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def completion_logprobs(
    model: torch.nn.Module,
    rollout: Rollout,
    rows: torch.Tensor,
    temperature: float,
    precision: str = "fp32",
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> ForwardOut:
    """log pi(o_t | q, o_<t) / T for the completion tokens of `rows`, trimmed to the longest completion."""
    pmask = rollout.prompt_mask[rows]
    cmask = rollout.completion_mask[rows]
    first = int(pmask.any(0).nonzero()[0]) if pmask.any() else pmask.shape[1]
    lc = int(cmask.any(0).nonzero()[-1]) + 1 if cmask.any() else 1
    prompt_ids, pmask = rollout.prompt_ids[rows, first:], pmask[:, first:]
    comp_ids, cmask = rollout.completion_ids[rows, :lc], cmask[:, :lc]
    input_ids = torch.cat([prompt_ids, comp_ids], dim=1)
    attn = torch.cat([pmask, torch.ones_like(cmask)], dim=1)  # pads after EOS are attended but never trained
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    with autocast(precision):
        logits = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids, logits_to_keep=lc + 1).logits
    logits = logits[:, :-1]  # logits at position t predict completion token t
    logp = token_logprobs(logits, comp_ids, temperature)
    entropy = None
    if with_entropy:
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():
            entropy = entropy_from_logits(logits, temperature)
    return ForwardOut(logp=logp, entropy=entropy, mask=cmask, cols=slice(0, lc))
