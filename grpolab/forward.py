"""Policy/reference forward passes over rollout rows: per-token logprobs (and entropy) of completion tokens only.

The sequence is [left-padded prompt | right-padded completion]. Position ids restart at each row's first real
token, as `generate` does, so training logprobs match the sampler's. Logits are computed only for the
completion positions (`logits_to_keep`), never for the prompt.

Shared prompt (`group_size` > 1 and `rows` made of whole groups): the G completions of a group share one
prompt, so the prompt is run once per group and the completions attend to its key/value cache (the gradient of
every completion flows back into the one prompt pass). Same function, same gradient, (G-1)/G less prompt compute.

Packed completions (`pack`, with SDPA attention): the G completions of a group are then laid end to end in one
row, with no padding, under a block attention mask (each token sees the group's prompt and the earlier tokens
of its own completion) and position ids that restart at the prompt length for every completion. Same function
again; the padding of every completion to the group's longest is not computed at all. Without `pack` the
prompt's cache is repeated G times and the completions run padded side by side.
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
    pack: bool = True,
) -> ForwardOut:
    """log pi(o_t | q, o_<t) / T for the completion tokens of `rows`, trimmed to the longest completion."""
    if group_size > 1 and whole_groups(rollout, rows, group_size):
        shared = _packed_group_logprobs if pack and packing_supported(model) else _shared_prompt_logprobs
        return shared(model, rollout, rows, temperature, precision, with_entropy, entropy_grad, group_size)
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


def cache_kwarg(model, cache) -> dict:
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
            rest = model(input_ids=comp_ids[:, :-1], attention_mask=attn, position_ids=position_ids, **cache_kwarg(model, cache)).logits
            logits = torch.cat([logits, rest], dim=1)
    return _finish(logits, comp_ids, cmask, temperature, with_entropy, entropy_grad)


def packing_supported(model) -> bool:
    """Packing needs an attention that takes a boolean 4-D mask as given: SDPA (eager adds the mask as floats)."""
    return getattr(model.config, "_attn_implementation", None) == "sdpa"


@dataclass
class PackedGroups:
    """The completions of P groups packed into P rows of S slots (slot = one input token of one completion).

    ids [P, S]:     input token o_t of completion i (t = 0 .. L_i - 2; the last token is only ever a target)
    targets [P, S]: o_{t+1}, the token that slot's logits predict
    seg, pos [P, S]: i within the group and t (-1 on pad slots)
    row, col [K]:   for the K real slots in row-major order, the micro-batch row i and column t + 1 they fill
    """

    ids: torch.Tensor
    targets: torch.Tensor
    seg: torch.Tensor
    pos: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    slot: tuple[torch.Tensor, torch.Tensor]


def pack_groups(comp_ids: torch.Tensor, cmask: torch.Tensor, group_size: int, pad_id: int = 0) -> PackedGroups:
    """Lay each group's completions [G * P, Lc] end to end, dropping padding (masks are 1 on a prefix)."""
    n, lc = comp_ids.shape
    needed = cmask[:, 1:].bool()  # input o_t is needed iff o_{t+1} is a real token
    row, t = needed.nonzero(as_tuple=True)
    group = row // group_size
    counts = torch.bincount(group, minlength=n // group_size)
    start = torch.cumsum(counts, 0) - counts
    k = torch.arange(len(row)) - start[group]
    p, s = n // group_size, max(int(counts.max()) if len(row) else 0, 1)
    ids = torch.full((p, s), pad_id, dtype=torch.long)
    targets, seg, pos = ids.clone(), torch.full((p, s), -1, dtype=torch.long), torch.full((p, s), -1, dtype=torch.long)
    ids[group, k], targets[group, k] = comp_ids[row, t], comp_ids[row, t + 1]
    seg[group, k], pos[group, k] = row % group_size, t
    return PackedGroups(ids, targets, seg, pos, row, t + 1, (group, k))


def packed_attention_mask(prompt_mask: torch.Tensor, seg: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[P, 1, S, Lp + S] bool: slot q sees its group's real prompt tokens and slot k of the same completion with
    pos[k] <= pos[q]. Pad slots see the prompt only (never an empty row, which would give NaN)."""
    same = (seg.unsqueeze(2) == seg.unsqueeze(1)) & (seg.unsqueeze(2) >= 0)
    causal = pos.unsqueeze(1) <= pos.unsqueeze(2)
    prompt = prompt_mask.bool().unsqueeze(1).expand(-1, seg.shape[1], -1)
    return torch.cat([prompt, same & causal], dim=2).unsqueeze(1)


def _packed_group_logprobs(model, rollout, rows, temperature, precision, with_entropy, entropy_grad, group_size) -> ForwardOut:
    """Prompt once per group, then the group's completions packed into one row against the prompt's cache."""
    first, lc = _trim(rollout, rows)
    heads = rows[::group_size]
    pmask = rollout.prompt_mask[heads, first:]
    comp_ids, cmask = rollout.completion_ids[rows, :lc], rollout.completion_mask[rows, :lc]
    packed = pack_groups(comp_ids, cmask, group_size)
    with autocast(precision):
        out = model(
            input_ids=rollout.prompt_ids[heads, first:], attention_mask=pmask,
            position_ids=(pmask.cumsum(-1) - 1).clamp(min=0), use_cache=True, logits_to_keep=1,
        )
        first_logits = out.logits.repeat_interleave(group_size, dim=0)  # [N, 1, V]: predicts completion token 0
        rest = None
        if len(packed.row):
            cache = getattr(out, "cache", None) or out.past_key_values
            position_ids = pmask.sum(-1, keepdim=True) + packed.pos.clamp(min=0)
            rest = model(input_ids=packed.ids, attention_mask=packed_attention_mask(pmask, packed.seg, packed.pos),
                         position_ids=position_ids, **cache_kwarg(model, cache)).logits
    first_out = _finish(first_logits, comp_ids[:, :1], cmask[:, :1], temperature, with_entropy, entropy_grad)

    def unpack(first_col: torch.Tensor, packed_vals: torch.Tensor | None) -> torch.Tensor:
        full = torch.cat([first_col, first_col.new_zeros(len(rows), lc - 1)], dim=1)
        return full if packed_vals is None else full.index_put((packed.row, packed.col), packed_vals[packed.slot])

    rest_out = None if rest is None else _finish(rest, packed.targets, None, temperature, with_entropy, entropy_grad)
    logp = unpack(first_out.logp, None if rest_out is None else rest_out.logp)
    entropy = None
    if with_entropy:
        entropy = unpack(first_out.entropy, None if rest_out is None else rest_out.entropy)
    return ForwardOut(logp=logp, entropy=entropy, mask=cmask, cols=slice(0, lc))
