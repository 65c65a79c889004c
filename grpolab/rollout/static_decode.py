"""A static-shape decode step for group sampling (`rollout.decoder: static`), exact against rollout/decode.py.

`decode_groups` (decode.py) drops finished rows from the batch and grows its cache view by one position a step, so
every step has a new shape. Here every step of a decode call has one shape:

- **prefill once per group**, as decode_groups does (the same forward, the same numbers), then the prompt's
  keys/values, repeated G times, are written into a transformers `StaticCache` of W positions per row, W = the
  padded prompt width L plus max_new_tokens, rounded up to a multiple of `CAPACITY_STEP` (so calls whose prompts
  differ a little in width share one shape). The cache is written in place, one position a step (position L + t
  at step t, for every row alike: the prompts are left-padded to one width);
- **rows that finish stay in place**: they keep running (on their last token) and their results are discarded
  (tokens stay `pad_id`, logprobs 0), so the step always has N = P * G rows;
- **one fixed mask**: a [N, W] mask, the prompt's padding mask followed by ones. The cache masks what is not yet
  written by causality (a query at cache position L + t sees positions <= L + t only), so the mask never changes;
- **sampling fused into the step**: `static_step` runs the forward of one new token per row and decode.py's
  `sample_tokens` on its logits (temperature, top-k / top-p, inverse-CDF draw, log q and log q_full of the sampled
  token), one function, the unit that `compile` hands to torch.compile;
- **the same uniform numbers**: decode.py's `uniforms` draws one number per row per step, finished or not, from the
  same generators in the same order, so every row samples the same tokens as under decode_groups (tested: tokens,
  mask, logprobs and untruncated logprobs, greedy and seeded, rows finishing at different steps, left-padded
  prompts of different lengths).

The attention reads the same key/value entries as decode_groups' plus masked positions (weight exp(-inf) = 0), so
the sums agree to float rounding (tested at 1e-5 on the logprobs in float32, tokens identical).

`compile=True` compiles `static_step` (torch.compile, inductor; the weights stay inputs of the graph, so an
optimizer step changing them in place does not recompile; the caches are kept per shape and reused across calls,
so a graph is compiled once per shape and run). Weights are not prepacked then (inductor chooses its own kernels).
A machine where compiling or running the compiled step fails decodes eagerly, after one warning line.
"""

from __future__ import annotations

import math
import warnings

import torch

from .cache import cache_kwarg
from .decode import Decoded, NonFiniteLogitsError, TextStop, sample_tokens, truncates, uniforms
from .prepack import prepacked_linears

try:
    from transformers import StaticCache
except ImportError:  # pragma: no cover - transformers without a static cache
    StaticCache = None

CAPACITY_STEP = 64  # cache positions per row are rounded up to a multiple of this (fewer distinct shapes)


def static_step(model, cache, attn: torch.Tensor, tok: torch.Tensor, pos: torch.Tensor, uniform: torch.Tensor | None,
                temperature: float, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step of fixed shape: token ids tok [N] at positions pos [N] enter the model, their keys/values are
    written in place into `cache` at its next position, and sample_tokens (decode.py) draws the next token from the
    logits with `uniform` [N] (None = greedy). Returns (token [N], log q(token) [N], log q_full(token) [N])."""
    out = model(input_ids=tok.unsqueeze(-1), attention_mask=attn, position_ids=pos.unsqueeze(-1), use_cache=True,
                **cache_kwarg(model, cache))
    return sample_tokens(out.logits[:, -1], temperature, uniform, top_k, top_p)


class StaticDecoder:
    """Decodes groups with a fixed-shape step. Holds one StaticCache per (rows, positions, dtype, device), reused by
    later calls of that shape (its entries are overwritten; nothing of an earlier call is read: the prompt is
    written at positions [0, L) and each step at L + t before it is attended to), and, with `compile`, the compiled
    step. `compile` falls back to the eager step, with one warning, where torch.compile fails."""

    def __init__(self, compile: bool = False):
        if StaticCache is None:
            raise RuntimeError("rollout.decoder static needs transformers' StaticCache (transformers >= 4.56)")
        self.compile = compile
        self._caches: dict[tuple, object] = {}
        self._compiled = None

    def _cache(self, model, rows: int, capacity: int, dtype: torch.dtype, device: torch.device):
        key = (id(model), rows, capacity, dtype, device)
        cache = self._caches.get(key)
        if cache is None:
            self._caches = {k: v for k, v in self._caches.items() if k[0] == id(model)}  # one model's caches only
            cache = self._caches[key] = StaticCache(config=model.config, max_cache_len=capacity)
        else:
            cache.reset()
        return cache

    def _step(self):
        if not self.compile:
            return static_step
        if self._compiled is None:
            self._compiled = torch.compile(static_step, dynamic=False)
        return self._compiled

    def _fall_back(self, err: Exception) -> None:
        warnings.warn(f"rollout.decoder static: the compiled decode step failed ({type(err).__name__}: "
                      f"{str(err).splitlines()[0] if str(err) else ''}); decoding eagerly", RuntimeWarning, stacklevel=3)
        self.compile, self._compiled = False, None

    def prefill(self, model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
                max_new_tokens: int):
        """The prompts' forward (once per group, as decode_groups runs it) -> (cache, logits [N, V], mask [N, W],
        next positions [N]): the cache holds each prompt's keys/values repeated G times at positions [0, L)."""
        positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True,
                    logits_to_keep=1)
        dynamic = getattr(out, "cache", None) or out.past_key_values
        width = prompt_ids.shape[1]
        capacity = CAPACITY_STEP * math.ceil((width + max_new_tokens) / CAPACITY_STEP)
        n = prompt_ids.shape[0] * group_size
        first = dynamic.layers[0].keys
        cache = self._cache(model, n, capacity, first.dtype, first.device)
        for i, layer in enumerate(dynamic.layers):
            cache.update(layer.keys.repeat_interleave(group_size, dim=0),
                         layer.values.repeat_interleave(group_size, dim=0), i)
        attn = torch.ones((n, capacity), dtype=torch.bool, device=prompt_mask.device)
        attn[:, :width] = prompt_mask.repeat_interleave(group_size, dim=0).bool()
        logits = out.logits[:, -1].repeat_interleave(group_size, dim=0)
        return cache, logits, attn, attn[:, :width].sum(-1)

    @torch.no_grad()
    def decode(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group_size: int,
               max_new_tokens: int, temperature: float, stop_ids: list[int], pad_id: int, greedy: bool = False,
               top_k: int = 0, top_p: float = 1.0, generators: list[torch.Generator] | None = None,
               prepack: bool = True, stop_check: TextStop | None = None) -> Decoded:
        """decode_groups' contract (decode.py: arguments, result, rows group-major), computed with a fixed-shape
        step. prepack: the eager step multiplies by weights packed once per call (prepack.py), as decode_groups."""
        cache, logits, attn, pos = self.prefill(model, prompt_ids, prompt_mask, group_size, max_new_tokens)
        n, dev = logits.shape[0], prompt_ids.device
        cut = not greedy and truncates(top_k, top_p, logits.shape[-1])
        u = None if greedy else uniforms(n, group_size, generators).to(dev)
        tok, lp, lp_full = sample_tokens(logits, temperature, u, top_k, top_p)
        with prepacked_linears(model, n, enabled=prepack and not self.compile):
            return self._loop(model, cache, attn, pos, (tok, lp, lp_full), group_size, max_new_tokens, temperature,
                              stop_ids, pad_id, greedy, top_k, top_p, cut, generators, stop_check)

    def _loop(self, model, cache, attn, pos, sampled, group_size, max_new_tokens, temperature, stop_ids, pad_id,
              greedy, top_k, top_p, cut, generators, stop_check) -> Decoded:
        """Record step t's sample, stop finished rows, run the fixed-shape step for t + 1 (decode_groups' order of
        uniform draws: one per row per step, none after the last step)."""
        tok, lp, lp_full = sampled
        n, dev = tok.shape[0], tok.device
        tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=dev)
        logprobs = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=dev)
        logprobs_full = torch.zeros_like(logprobs) if cut else None
        lengths = torch.full((n,), max_new_tokens, dtype=torch.long, device=dev)
        finished = torch.zeros(n, dtype=torch.bool, device=dev)
        stops, rows = torch.tensor(stop_ids, dtype=torch.long, device=dev), torch.arange(n, device=dev)
        for t in range(max_new_tokens):
            live = ~finished
            tokens[:, t] = torch.where(live, tok, tokens[:, t])
            logprobs[:, t] = torch.where(live, lp.float(), logprobs[:, t])
            if cut:
                logprobs_full[:, t] = torch.where(live, lp_full.float(), logprobs_full[:, t])
            stopped = live & torch.isin(tok, stops)
            if stop_check is not None:
                stopped |= stop_check.ended(tokens, rows, live & ~stopped & stop_check.may_end(tok), t)
            lengths = torch.where(stopped, t + 1, lengths)
            finished |= stopped
            if bool(finished.all()) or t + 1 == max_new_tokens:
                break
            u = None if greedy else uniforms(n, group_size, generators).to(dev)
            tok, lp, lp_full = self._run(model, cache, attn, tok, pos, u, temperature, top_k, top_p)
            pos = pos + 1
        width = int(lengths.max())
        mask = (torch.arange(width, device=dev).unsqueeze(0) < lengths.unsqueeze(1)).long()
        full = logprobs_full[:, :width] if cut else None
        return Decoded(tokens[:, :width], mask, logprobs[:, :width], ~finished, full)

    def _run(self, model, cache, attn, tok, pos, u, temperature, top_k, top_p):
        """The step, compiled when asked; a compiled step that raises is dropped for the eager one, and the step
        rerun eagerly (its cache write is repeated at the same position: the cache's write counter is put back)."""
        step = self._step()
        if step is static_step:
            return step(model, cache, attn, tok, pos, u, temperature, top_k, top_p)
        lengths = [layer.cumulative_length.clone() for layer in cache.layers]
        try:
            return step(model, cache, attn, tok, pos, u, temperature, top_k, top_p)
        except NonFiniteLogitsError:  # the model's numbers, not the compiler: the eager step would say the same
            raise
        except Exception as err:  # noqa: BLE001 - any failure of the compiler: decode eagerly instead
            self._fall_back(err)
            for layer, length in zip(cache.layers, lengths):
                layer.cumulative_length.copy_(length)
            return static_step(model, cache, attn, tok, pos, u, temperature, top_k, top_p)
