"""Policy/reference forward passes over rollout rows: per-token logprobs (and entropy) of completion tokens only.

The sequence is [left-padded prompt | right-padded completion]. Position ids restart at each row's first real
token, as `generate` does, so training logprobs match the sampler's. Logits are computed only for the
completion positions (`logits_to_keep`), never for the prompt.

Shared prompt (`group_size` > 1 and `rows` made of whole groups): the G completions of a group share one
prompt, so the prompt is run once per group and its key/value cache is repeated G times (repeat_interleave is
differentiable: the gradient of every completion flows back into the one prompt pass). Same function, same
gradient, (G-1)/G less prompt compute.
"""

from __future__ import annotations

import contextlib
import inspect
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
    group_size: int = 1,
) -> ForwardOut:
    """log pi(o_t | q, o_<t) / T for the completion tokens of `rows`, trimmed to the longest completion."""
    if group_size > 1 and whole_groups(rollout, rows, group_size):
        return _shared_prompt_logprobs(model, rollout, rows, temperature, precision, with_entropy, entropy_grad, group_size)
    first, lc = _trim(rollout, rows)
    prompt_ids, pmask = rollout.prompt_ids[rows, first:], rollout.prompt_mask[rows, first:]
    comp_ids, cmask = rollout.completion_ids[rows, :lc], rollout.completion_mask[rows, :lc]
    input_ids = torch.cat([prompt_ids, comp_ids], dim=1)
    attn = torch.cat([pmask, torch.ones_like(cmask)], dim=1)  # pads after EOS are attended but never trained
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    with autocast(precision):
        logits = model(input_ids=input_ids, attention_mask=attn, position_ids=position_ids, logits_to_keep=lc + 1).logits
    return _finish(logits[:, :-1], comp_ids, cmask, temperature, with_entropy, entropy_grad)


def _trim(rollout: Rollout, rows: torch.Tensor) -> tuple[int, int]:
    """(first prompt column any row uses, number of completion columns any row uses)."""
    pmask, cmask = rollout.prompt_mask[rows], rollout.completion_mask[rows]
    first = int(pmask.any(0).nonzero()[0]) if pmask.any() else pmask.shape[1]
    lc = int(cmask.any(0).nonzero()[-1]) + 1 if cmask.any() else 1
    return first, lc


def _finish(logits, comp_ids, cmask, temperature, with_entropy, entropy_grad) -> ForwardOut:
    """logits[:, t] predicts completion token t: logprobs (and entropy) of the completion tokens."""
    logp = token_logprobs(logits, comp_ids, temperature)
    entropy = None
    if with_entropy:
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():
            entropy = entropy_from_logits(logits, temperature)
    return ForwardOut(logp=logp, entropy=entropy, mask=cmask, cols=slice(0, comp_ids.shape[1]))


def _cache_kwarg(model, cache) -> dict:
    """transformers >= 5.2x names the argument `cache`; earlier releases `past_key_values`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps forward(*args, **kw)
    params = inspect.signature(base.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}


def whole_groups(rollout: Rollout, rows: torch.Tensor, group_size: int) -> bool:
    """True when `rows` is a sequence of complete groups, each group's G rows consecutive."""
    if len(rows) % group_size:
        return False
    g = rollout.group[rows].view(-1, group_size)
    return bool((g == g[:, :1]).all()) and len(set(g[:, 0].tolist())) == g.shape[0]


def _shared_prompt_logprobs(model, rollout, rows, temperature, precision, with_entropy, entropy_grad, group_size) -> ForwardOut:
    """Prompt once per group (with its KV cache repeated G times), then the completions against that cache."""
    first, lc = _trim(rollout, rows)
    heads = rows[::group_size]
    pmask = rollout.prompt_mask[heads, first:]
    comp_ids, cmask = rollout.completion_ids[rows, :lc], rollout.completion_mask[rows, :lc]
    with autocast(precision):
        out = model(
            input_ids=rollout.prompt_ids[heads, first:], attention_mask=pmask,
            position_ids=(pmask.cumsum(-1) - 1).clamp(min=0), use_cache=True, logits_to_keep=1,
        )
        cache = getattr(out, "cache", None) or out.past_key_values
        cache.batch_repeat_interleave(group_size)
        logits = out.logits.repeat_interleave(group_size, dim=0)  # predicts completion token 0
        if lc > 1:
            pmask_rows = pmask.repeat_interleave(group_size, dim=0)
            attn = torch.cat([pmask_rows, torch.ones_like(cmask[:, :-1])], dim=1)
            position_ids = pmask_rows.sum(-1, keepdim=True) + torch.arange(lc - 1).unsqueeze(0)
            rest = model(input_ids=comp_ids[:, :-1], attention_mask=attn, position_ids=position_ids, **_cache_kwarg(model, cache)).logits
            logits = torch.cat([logits, rest], dim=1)
    return _finish(logits, comp_ids, cmask, temperature, with_entropy, entropy_grad)
