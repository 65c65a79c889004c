"""Policy/reference forward passes over rollout rows: per-token logprobs (and entropy) of completion tokens only.

The sequence is [left-padded prompt | right-padded completion]. Position ids restart at each row's first real
token, as `generate` does, so training logprobs match the sampler's. Logits are computed only for the
completion positions (`logits_to_keep`), never for the prompt.

Shared prompt (`share_prompt`): consecutive rows of the same group share one prompt, so the prompt is run once
per such run of rows (a whole group, or the part of a group a micro-batch holds) and the completions attend to
its key/value cache (the gradient of every completion flows back into the one prompt pass). Same function, same
gradient, (G-1)/G less prompt compute.

Packed completions (`pack`, with SDPA attention; the default): the group's completions are laid end to end,
several to a row where they fit (grpolab/training/packing.py), under a block-causal mask (each token sees the group's
prompt and the earlier tokens of its own completion) with position ids restarted at the prompt length for every
completion. Same function again, with only the unfilled ends of rows as padding. Without `pack` the prompt's cache is repeated
G times and the completions run padded side by side.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..algo.logprobs import logprobs_and_entropy
from ..rollout.base import Rollout
from ..rollout.cache import cache_kwarg
from .attention import SDPA_NAMES
from .packing import block_causal_mask, pack_completions


@dataclass
class ForwardOut:
    logp: torch.Tensor  # [b, Lc] float32
    entropy: torch.Tensor | None  # [b, Lc] float32, detached unless entropy_grad
    mask: torch.Tensor  # [b, Lc] completion mask, trimmed like logp
    cols: slice  # which completion columns of the rollout these cover


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}  # train.precision -> autocast dtype (fp32: none)


def autocast(precision: str, device: torch.device | str = "cpu"):
    """bf16 / fp16 autocast over fp32 master weights on `device`'s type (where the model's weights are), or nothing
    for fp32."""
    if precision in AUTOCAST:
        return torch.autocast(torch.device(device).type, dtype=AUTOCAST[precision])
    return contextlib.nullcontext()


@contextlib.contextmanager
def weight_casts_kept(precision: str, device: torch.device | str = "cpu"):
    """Around the micro-batches of one optimizer step (the weights do not change inside it): bf16 (or fp16) autocast
    casts each float32 weight once and reuses that cast in every micro-batch's forward, instead of casting all weights
    again.

    torch keeps autocast's cast cache until the outermost autocast region exits: the enabled region opened here
    holds the cache, and the disabled one inside it leaves everything between the forwards (loss, backward)
    outside autocast, as it is without this. The same casts, so the same numbers (tests/test_weight_casts.py).
    """
    if precision not in AUTOCAST:
        yield
        return
    kind = torch.device(device).type
    with torch.autocast(kind, dtype=AUTOCAST[precision]), torch.autocast(kind, enabled=False):
        yield


def completion_logprobs(
    model: torch.nn.Module,
    rollout: Rollout,
    rows: torch.Tensor,
    temperature: float,
    precision: str = "fp32",
    with_entropy: bool = False,
    entropy_grad: bool = False,
    share_prompt: bool = False,
    pack: bool = True,
) -> ForwardOut:
    """log pi(o_t | q, o_<t) / T for the completion tokens of `rows`, trimmed to the longest completion."""
    run, heads = prompt_runs(rollout, rows)
    if share_prompt and len(heads) < len(rows):  # some prompt is used by more than one row
        shared = _packed_group_logprobs if pack and packing_supported(model) else _shared_prompt_logprobs
        return shared(model, rollout, rows, temperature, precision, with_entropy, entropy_grad, run, heads)
    first, lc = _trim(rollout, rows)
    prompt_ids, pmask = rollout.prompt_ids[rows, first:], rollout.prompt_mask[rows, first:]
    comp_ids, cmask = rollout.completion_ids[rows, :lc], rollout.completion_mask[rows, :lc]
    input_ids = torch.cat([prompt_ids, comp_ids], dim=1)
    attn = torch.cat([pmask, torch.ones_like(cmask)], dim=1)  # pads after EOS are attended but never trained
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    with autocast(precision, rollout.completion_ids.device):
        logits = model(
            input_ids=input_ids, attention_mask=attn, position_ids=position_ids, logits_to_keep=lc + 1
        ).logits
    return _finish(logits[:, :-1], comp_ids, cmask, temperature, with_entropy, entropy_grad)


def _trim(rollout: Rollout, rows: torch.Tensor) -> tuple[int, int]:
    """(first prompt column any row uses, number of completion columns any row uses)."""
    pmask, cmask = rollout.prompt_mask[rows], rollout.completion_mask[rows]
    first = int(pmask.any(0).nonzero()[0]) if pmask.any() else pmask.shape[1]
    lc = int(cmask.any(0).nonzero()[-1]) + 1 if cmask.any() else 1
    return first, lc


def _finish(logits, comp_ids, cmask, temperature, with_entropy, entropy_grad) -> ForwardOut:
    """logits[:, t] predicts completion token t: logprobs (and entropy) of the completion tokens."""
    logp, entropy = logprobs_and_entropy(logits, comp_ids, temperature, with_entropy, entropy_grad)
    return ForwardOut(logp=logp, entropy=entropy, mask=cmask, cols=slice(0, comp_ids.shape[1]))


def prompt_runs(rollout: Rollout, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(run [b], heads [P]): consecutive rows of the same group share one prompt; run numbers each row's prompt
    0, 1, ... and heads holds the first row of every run."""
    g = rollout.group[rows]
    new = torch.ones(len(rows), dtype=torch.bool)
    new[1:] = g[1:] != g[:-1]
    return torch.cumsum(new.long(), 0) - 1, rows[new]


def _shared_prompt_logprobs(
    model, rollout, rows, temperature, precision, with_entropy, entropy_grad, run, heads
) -> ForwardOut:
    """Prompt once per run (its KV cache repeated for each row of the run), then the padded completions."""
    first, lc = _trim(rollout, rows)
    pmask = rollout.prompt_mask[heads, first:]
    comp_ids, cmask = rollout.completion_ids[rows, :lc], rollout.completion_mask[rows, :lc]
    with autocast(precision, rollout.completion_ids.device):
        out = model(
            input_ids=rollout.prompt_ids[heads, first:],
            attention_mask=pmask,
            position_ids=(pmask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )
        cache = getattr(out, "cache", None) or out.past_key_values
        cache.batch_select_indices(run)
        logits = out.logits[run]  # predicts completion token 0
        if lc > 1:
            pmask_rows = pmask[run]
            attn = torch.cat([pmask_rows, torch.ones_like(cmask[:, :-1])], dim=1)
            position_ids = pmask_rows.sum(-1, keepdim=True) + torch.arange(lc - 1).unsqueeze(0)
            rest = model(
                input_ids=comp_ids[:, :-1], attention_mask=attn, position_ids=position_ids, **cache_kwarg(model, cache)
            ).logits
            logits = torch.cat([logits, rest], dim=1)
    return _finish(logits, comp_ids, cmask, temperature, with_entropy, entropy_grad)


def packing_supported(model) -> bool:
    """Packing needs an attention that takes a boolean 4-D mask as given: SDPA (eager adds the mask as floats)."""
    return getattr(model.config, "_attn_implementation", None) in SDPA_NAMES


def _packed_group_logprobs(
    model, rollout, rows, temperature, precision, with_entropy, entropy_grad, run, heads
) -> ForwardOut:
    """Each group's prompt (but its last token) once through the decoder, cached; then the completions packed
    into rows (packing.py) through the whole model: one embedding lookup and one LM-head projection per pass."""
    first, lc = _trim(rollout, rows)
    prompt_ids, pmask = rollout.prompt_ids[heads, first:], rollout.prompt_mask[heads, first:]
    comp_ids, cmask = rollout.completion_ids[rows, :lc], rollout.completion_mask[rows, :lc]
    packed = pack_completions(comp_ids, cmask, prompt_ids[:, -1], run)
    prefix, prefix_mask = prompt_ids[:, :-1], pmask[:, :-1]  # left-padded: the last column is every prompt's last token
    row_prefix_mask = prefix_mask[packed.group]
    with autocast(precision, rollout.completion_ids.device):
        embeds = model.get_input_embeddings()(torch.cat([prefix.flatten(), packed.ids.flatten()]))
        prefix_embeds, row_embeds = embeds.split([prefix.numel(), packed.ids.numel()])
        cache_arg = {}
        if prefix.shape[1]:
            out = model.get_decoder()(
                inputs_embeds=prefix_embeds.view(*prefix.shape, -1),
                attention_mask=prefix_mask,
                position_ids=(prefix_mask.cumsum(-1) - 1).clamp(min=0),
                use_cache=True,
            )
            cache = getattr(out, "cache", None) or out.past_key_values
            cache.batch_select_indices(packed.group)
            cache_arg = cache_kwarg(model, cache)
        position_ids = pmask.sum(-1)[packed.group].unsqueeze(-1) - 1 + packed.pos.clamp(min=0)
        logits = model(
            inputs_embeds=row_embeds.view(*packed.ids.shape, -1),
            position_ids=position_ids,
            attention_mask=block_causal_mask(row_prefix_mask, packed.seg, packed.pos),
            **cache_arg,
        ).logits
    out = _finish(logits, packed.targets, None, temperature, with_entropy, entropy_grad)

    def unpack(packed_vals: torch.Tensor) -> torch.Tensor:
        return packed_vals.new_zeros(comp_ids.shape).index_put((packed.row, packed.col), packed_vals[packed.slot])

    entropy = unpack(out.entropy) if with_entropy else None
    return ForwardOut(logp=unpack(out.logp), entropy=entropy, mask=cmask, cols=slice(0, lc))
