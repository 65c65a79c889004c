"""grpolab's own decode loop for group sampling: the default way the HF engine samples (`rollout.decoder: grpolab`).

It computes the same thing as `model.generate(do_sample=True, num_return_sequences=G)` -- G independent samples
from softmax(logits / T) (optionally top-k / top-p truncated) until a stop token or max_new_tokens -- with less
work per token:

- **prefill once per group**: each distinct prompt runs through the model once and its key/value cache is repeated
  G times (`generate` with num_return_sequences=G prefills every copy);
- **finished rows leave the batch**: a row that emitted a stop token is dropped from the batch and the cache, so
  later steps run only the rows still sampling;
- **inverse-CDF sampling**: one float64 uniform number per row and a cumulative sum, instead of `torch.multinomial`,
  which draws one exponential per vocabulary entry (its cost: docs/performance.md); the
  cumulative sum in two levels (block sums, then inside one block), accumulated in float64 but never cast and summed
  over the whole vocabulary. The uniform is float64 (53 random bits): a float32 one lies on a 2^-24 grid, on which
  a token of probability below ~6e-8 is drawn with probability 0 or 6e-8 whatever its own (logits
  log([0.5, 1e-9, 0.5]) drew the middle token 60x too often);
- **non-finite logits are an error** (NonFiniteLogitsError, naming the row), never a token: a NaN or +inf logit, or
  a row whose every logit is -inf, has no distribution to sample from;
- the sampled token's log-probability comes out of the same log-sum-exp, never a second pass: under the
  distribution actually sampled (after top-k / top-p) and, when truncating, also untruncated.
- **the KV cache grows in place** (grpolab/rollout/cache.py): each layer's keys and values are written into buffers
  allocated once for the prompt plus max_new_tokens, not concatenated (a copy of the whole cache) every step;
- **weights packed once per call** (float32 on a CPU, bfloat16 on a CPU with bf16 units; grpolab/rollout/prepack.py):
  after the prefill every linear layer multiplies by a copy of its weight packed once for oneDNN, instead of the
  BLAS re-packing it on every few-row product (measured in docs/performance.md).

One loop, `sample_loop`, samples after the prefill for both generation (`decode_groups`: prefill once per group)
and agent turns (grpolab/agents/turns.py: prefill of what each episode has not read yet); each caller keeps only its
prefill (and agent turns a hook that keeps each stopped episode's cache).

The uniform numbers are drawn for every row at every step, active or not, so the tokens a row gets do not depend on
when other rows finish (tested: compaction on and off sample identical tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import GrpolabError
from .cache import cache_kwarg, preallocate
from .prepack import prepacked_linears


@dataclass
class Decoded:
    tokens: torch.Tensor  # [N, Lc] long, right-padded with pad_id
    mask: torch.Tensor  # [N, Lc] long, 1 on every sampled token (the stop token included)
    logprobs: torch.Tensor  # [N, Lc] float32 log q(token) under the distribution sampled (after top-k/top-p); 0 on pads
    truncated: torch.Tensor  # [N] bool, no stop token within max_new_tokens
    logprobs_untruncated: torch.Tensor | None = None  # [N, Lc] log softmax(logits / T)(token); None: no truncation


def truncates(top_k: int, top_p: float, vocab: int) -> bool:
    """Whether top-k / top-p can remove any token (top_k = 0 or >= V and top_p = 1 keep them all)."""
    return 0 < top_k < vocab or top_p < 1.0


def truncate_logits(z: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) truncation of scaled logits z [B, V]: removed entries become -inf.

    top-k keeps the k largest; top-p keeps the smallest set of largest entries whose probability sums to >= top_p
    (always at least one), as Hugging Face's TopK/TopP logits warpers do.
    """
    if top_k and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, dim=-1, descending=True)
        cum = torch.softmax(sorted_z, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_z, dim=-1)) >= top_p  # mass before this entry already >= top_p
        z = z.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    return z


class NonFiniteLogitsError(GrpolabError):
    """The logits of a sampled row have no distribution: a NaN or +inf entry, or every entry -inf."""


def check_finite(z: torch.Tensor, lse: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Raise NonFiniteLogitsError naming the first bad row (and how many there are) when logsumexp(z) [B] is not
    finite; one [B]-sized check when every row is fine. ``rows`` maps batch rows to the output rows named."""
    bad = ~torch.isfinite(lse)
    if not bool(bad.any()):
        return
    where = bad.nonzero().flatten().tolist()
    b = where[0]
    row = int(rows[b]) if rows is not None else b
    kind = (
        "a NaN logit"
        if bool(torch.isnan(z[b]).any())
        else "a +inf logit"
        if bool(torch.isposinf(z[b]).any())
        else "every logit -inf"
    )
    more = f" (and {len(where) - 1} more row{'s' if len(where) > 2 else ''})" if len(where) > 1 else ""
    raise NonFiniteLogitsError(
        f"sampling: row {row} of the batch{more} has {kind} (logits / temperature); there is no distribution to "
        f"sample from -- the model's weights or activations are not finite (a diverged update, e.g. too high a "
        f"learning rate) or the temperature is not a positive finite number"
    )


CDF_BLOCK = 1024  # vocabulary entries per block of the two-level inverse CDF


def inverse_cdf(p: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [B], mass [B] float64): the first v with F(v) > u * F(V), F(v) = sum_{w <= v} p_w in float64, for
    unnormalised probabilities p [B, V] (float32, >= 0) and uniforms u [B] in [0, 1) (float64: `uniforms`; a
    float32 u would put its 2^-24 grid on the CDF); mass = F(V).

    Two levels, so the vocabulary is read once more and never cast or cumulatively summed whole: the block sums
    S_j = sum of p over block j (CDF_BLOCK entries, float64 accumulation) and their cumulative sums locate the
    block that holds u * F(V); the cumulative sum inside that one block locates the entry. P(token = v) = p_v / F(V),
    as with one cumulative sum over the whole vocabulary (up to float64 rounding at block edges).
    """
    rows, vocab = p.shape
    block = min(CDF_BLOCK, vocab)
    nb = -(-vocab // block)
    pad = nb * block - vocab
    blocks = (torch.nn.functional.pad(p, (0, pad)) if pad else p).reshape(rows, nb, block)  # pad(0) would copy
    block_sums = blocks.sum(-1, dtype=torch.float64)  # [B, nb]
    block_cdf = block_sums.cumsum(-1)
    mass = block_cdf[:, -1]
    target = uniform.to(torch.float64) * mass
    j = torch.searchsorted(block_cdf, target.unsqueeze(-1), right=True).squeeze(-1).clamp_(max=nb - 1)
    r = torch.arange(rows, device=p.device)
    inside = blocks[r, j].to(torch.float64).cumsum(-1)  # [B, block]: the chosen block only
    rest = target - (block_cdf[r, j] - block_sums[r, j])
    k = torch.searchsorted(inside, rest.unsqueeze(-1), right=True).squeeze(-1).clamp_(max=block - 1)
    return (j * block + k).clamp_(max=vocab - 1), mass


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    uniform: torch.Tensor | None,
    top_k: int = 0,
    top_p: float = 1.0,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step: (token [B], log q(token) [B], log q_full(token) [B]) from logits [B, V].

    z = logits / T, log q_full(v) = z_v - logsumexp(z): the untruncated distribution (what the trainer computes).
    Sampling (uniform u [B] in [0, 1)): zt = truncate(z), p = softmax(zt), F = cumsum(exp(zt - logsumexp(z))) in
    float64, and the token is the first v with F(v) > u * F(V) -- inverse-CDF sampling (`inverse_cdf`, two levels),
    so P(token = v) = p_v exactly. The distribution sampled, q = softmax(zt), is the one recorded for importance weights:
    log q(v) = zt_v - logsumexp(zt) = log q_full(v) - log F(V), F(V) being the kept probability mass (no second
    pass over the vocabulary). Without truncation q = q_full and the same tensor is returned twice.
    uniform None = greedy (argmax of z).

    P(token = v) = p_v / F(V) up to float64 rounding of F and u, p_v being the float32 probability (relative error
    ~1e-7 of the exact softmax): a 53-bit uniform resolves probabilities down to ~1e-16. A row whose logsumexp is
    not finite (a NaN or +inf logit, or every logit -inf) raises NonFiniteLogitsError naming it: ``rows`` [B] gives
    each batch row's output row for the message (None: the batch row itself).
    """
    z = logits.float().div_(temperature) if logits.dtype != torch.float32 else logits / temperature  # no extra copy
    lse = torch.logsumexp(z, dim=-1)
    check_finite(z, lse, rows)
    if uniform is None:
        token = z.argmax(-1)
        logp = z.gather(-1, token.unsqueeze(-1)).squeeze(-1) - lse
        return token, logp, logp
    cut = truncates(top_k, top_p, z.shape[-1])
    zt = truncate_logits(z, top_k, top_p) if cut else z
    token, mass = inverse_cdf((zt - lse.unsqueeze(-1)).exp_(), uniform)
    logp_full = z.gather(-1, token.unsqueeze(-1)).squeeze(-1) - lse
    if not cut:
        return token, logp_full, logp_full
    return token, (logp_full - torch.log(mass)).float(), logp_full


@dataclass
class TextStop:
    """A stop rule on the completion text (rollout/stop.py) for the decode loop: `rule(text)` is True when the
    completion is finished; it is asked only for rows whose new token is one of `triggers` (token ids whose text
    holds a character the rule reacts to), with the row's text decoded by `decode`."""

    rule: Callable[[str], bool]
    triggers: torch.Tensor  # [K] long
    decode: Callable[[list[int]], str]

    def may_end(self, tok: torch.Tensor) -> torch.Tensor:
        return torch.isin(tok, self.triggers.to(tok.device))

    def ended(self, tokens: torch.Tensor, rows: torch.Tensor, asked: torch.Tensor, t: int) -> torch.Tensor:
        """[B] bool: the batch rows in `asked` whose completion (output row rows[b], tokens 0..t) the rule ends."""
        out = torch.zeros_like(asked)
        for b in asked.nonzero().flatten().tolist():
            out[b] = self.rule(self.decode(tokens[int(rows[b]), : t + 1].tolist()))
        return out


def step_logits(model, tok: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache) -> torch.Tensor:
    """Logits [B, V] of one new token per row, the KV cache `cache` growing in place."""
    out = model(
        input_ids=tok.unsqueeze(-1),
        attention_mask=attn,
        position_ids=pos.unsqueeze(-1),
        use_cache=True,
        **cache_kwarg(model, cache),
    )
    return out.logits[:, -1]


def uniforms(n: int, group_size: int, generators: list[torch.Generator] | None) -> torch.Tensor:
    """One float64 uniform in [0, 1) per row for a decode step (torch.rand in float64: k * 2^-53 for a 53-bit random
    k, one 64-bit draw of the generator each): group_size from each group's generator, or n from the global RNG."""
    if generators is None:
        return torch.rand(n, dtype=torch.float64)
    return torch.cat([torch.rand(group_size, generator=g, dtype=torch.float64) for g in generators])


@torch.no_grad()
def decode_groups(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    stop_ids: list[int],
    pad_id: int,
    greedy: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    compact: bool = True,
    generators: list[torch.Generator] | None = None,
    prepack: bool = True,
    preallocate_cache: bool = True,
    stop_check: "TextStop | None" = None,
) -> Decoded:
    """Sample group_size completions for each left-padded prompt row; rows of the result are group-major.

    generators: one CPU torch.Generator per prompt (its group's own sampling stream: the group's tokens then
    depend only on its generator, not on which other groups share the batch); None draws from the global RNG.
    Every tensor is made on the prompts' device. prepack False: the decode steps multiply by the weights as they
    are, not by copies packed once per call (prepack.py). preallocate_cache False: the KV cache grows by
    concatenation (transformers' default) instead of in place (cache.py). stop_check: a stop rule on the text
    (rollout/stop.py), asked after each token that may change its answer; a row it ends is finished like a row that
    sampled a stop token (not truncated). The prefill is this function's; the sampling is `sample_loop`'s."""
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    cache = getattr(out, "cache", None) or out.past_key_values
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
    if preallocate_cache:
        preallocate(cache, prompt_ids.shape[1] + max_new_tokens)
    logits = out.logits[:, -1].repeat_interleave(group_size, dim=0)
    attn = prompt_mask.repeat_interleave(group_size, dim=0)
    loop = SamplingLoop(
        max_new_tokens,
        temperature,
        stop_ids,
        pad_id,
        greedy=greedy,
        top_k=top_k,
        top_p=top_p,
        group_size=group_size,
        generators=generators,
        prepack=prepack,
        compact=compact,
        stop_check=stop_check,
    )
    return sample_loop(model, logits, cache, attn, loop)


@dataclass(frozen=True)
class SamplingLoop:
    """What `sample_loop` samples: up to max_new_tokens per row from softmax(logits / temperature) (top-k / top-p
    truncated; greedy: argmax), a row ending at a token of stop_ids (or where stop_check's text rule ends it);
    pads are pad_id. group_size rows share each generator's stream (uniforms); compact False keeps finished rows in
    the batch (the same tokens: tested); prepack: weights packed once per call (prepack.py)."""

    max_new_tokens: int
    temperature: float
    stop_ids: list[int]
    pad_id: int
    greedy: bool = False
    top_k: int = 0
    top_p: float = 1.0
    group_size: int = 1
    generators: list[torch.Generator] | None = None
    prepack: bool = True
    compact: bool = True
    stop_check: "TextStop | None" = None


OnStop = Callable[[object, torch.Tensor, torch.Tensor, torch.Tensor], None]


def sample_loop(
    model: torch.nn.Module,
    logits: torch.Tensor,
    cache,
    attn: torch.Tensor,
    loop: SamplingLoop,
    on_stop: OnStop | None = None,
) -> Decoded:
    """The sampling loop of generation (decode_groups) and agent turns (agents/turns.py), after their prefills.

    logits [N, V]: each row's next-token logits; cache: the batch KV cache of the tokens read (row i attends where
    attn [N, W] is 1). Each step draws one float64 uniform per row (`uniforms`, for every row, finished or not),
    samples a token and its log-probabilities (`sample_tokens`), writes them into row-major buffers [N,
    max_new_tokens], ends the rows that sampled a stop token, drops them from the batch and the cache (compact) and
    feeds the others' tokens (`step_logits`). ``on_stop(cache, stopped [B] bool, rows [B], attn [B, W])``, when
    given, is called each step with the rows that just stopped, before they leave the cache (agent turns keep
    their episodes' caches). Returns the tokens, mask, log-probabilities and truncation flags (`Decoded`)."""
    n, dev = logits.shape[0], logits.device
    next_pos = attn.sum(-1)
    stops = torch.tensor(loop.stop_ids, dtype=torch.long, device=dev)
    width = loop.max_new_tokens
    tokens = torch.full((n, width), loop.pad_id, dtype=torch.long, device=dev)
    logprobs = torch.zeros((n, width), dtype=torch.float32, device=dev)
    cut = not loop.greedy and truncates(loop.top_k, loop.top_p, logits.shape[-1])
    logprobs_full = torch.zeros((n, width), dtype=torch.float32, device=dev) if cut else None
    lengths = torch.full((n,), width, dtype=torch.long, device=dev)
    ended = torch.zeros(n, dtype=torch.bool, device=dev)  # per output row: a stop token was sampled
    rows = torch.arange(n, device=dev)  # which output row each batch row is
    finished = torch.zeros(n, dtype=torch.bool, device=dev)  # per batch row (only used when compaction is off)
    with prepacked_linears(model, n, enabled=loop.prepack):
        for t in range(width):
            u = None if loop.greedy else uniforms(n, loop.group_size, loop.generators).to(dev)[rows]
            tok, lp, lp_full = sample_tokens(logits, loop.temperature, u, loop.top_k, loop.top_p, rows)
            live = ~finished
            tokens[rows[live], t], logprobs[rows[live], t] = tok[live], lp[live]
            if cut:
                logprobs_full[rows[live], t] = lp_full[live]
            stopped = live & torch.isin(tok, stops)
            if loop.stop_check is not None:
                stopped |= loop.stop_check.ended(tokens, rows, live & ~stopped & loop.stop_check.may_end(tok), t)
            if on_stop is not None:
                on_stop(cache, stopped, rows, attn)
            lengths[rows[stopped]], ended[rows[stopped]] = t + 1, True
            finished |= stopped
            if bool(finished.all()) or t + 1 == width:
                break
            if loop.compact and bool(stopped.any()):
                keep = (~finished).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, tok, attn, next_pos, finished = rows[keep], tok[keep], attn[keep], next_pos[keep], finished[keep]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            logits, next_pos = step_logits(model, tok, attn, next_pos, cache), next_pos + 1
    span = int(lengths.max())
    mask = (torch.arange(span, device=dev).unsqueeze(0) < lengths.unsqueeze(1)).long()
    full = logprobs_full[:, :span] if cut else None
    return Decoded(tokens[:, :span], mask, logprobs[:, :span], ~ended, full)
