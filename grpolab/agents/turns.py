"""One model turn of many episodes that continues each episode's key/value cache: a turn feeds the model only the
tokens it has not read yet (docs/agents.md, "KV cache across turns").

Without it (the runner's ``reuse_cache=False``, grpolab.rollout.decode.decode_groups) every turn prefills each live
episode's whole sequence, prompt and earlier turns included: at turn k the model re-reads k - 1 turns and
observations. Here each episode keeps the keys and values of every token the model has read (an `EpisodeCache`,
taken from the batch cache when the episode's turn stops); the next turn feeds only what is new -- the turn's stop
token (sampled, never fed) and the observation.

Batch layout, the left-padded layout of a fresh prefill: row i's sequence of L_i tokens ends at the right edge of a
width W = max L_i, of which it has P_i in its cache. With F = max_i (L_i - P_i), every row feeds its last F tokens
(a row with fewer new tokens re-feeds a few it already had: recomputed, equal up to rounding) and the batch cache
holds the row's first L_i - F stored positions, ending where its fed tokens begin. Position ids count the real
tokens before each position, as in a fresh prefill, so the model computes the same function; only the rounding of
the prefill differs (the rows are summed in other shapes).

Sampling and everything after the prefill is the decode loop's own code (grpolab.rollout.decode.sample_loop: the
in-place cache, prepacked weights, finished rows leaving the batch), which hands each stopped row's cache to this
module before the row leaves the batch: one uniform per row per step from its episode's generator until the slowest
row stops, so both paths draw the same numbers and, given the same logits, the same tokens (tested: same tokens,
logprobs within float32 rounding, greedy and seeded).

Memory: an episode's cache lives between its turns: 2 x layers x kv_heads x head_dim numbers per token (SmolLM2-135M:
46 KB per token in float32), freed when the episode ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from ..rollout.cache import PreallocatedLayer, cache_kwarg, preallocate
from ..rollout.decode import Decoded, SamplingLoop, sample_loop
from ..rollout.grpolab_engine import left_pad


@dataclass
class EpisodeCache:
    """The keys and values of an episode's first `length` tokens: per layer (keys, values), each [H, length, D]."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def length(self) -> int:
        return self.layers[0][0].shape[-2]


def row_cache(cache, b: int, attended: torch.Tensor) -> EpisodeCache | None:
    """Batch row b's entries at the positions it attends to (its real tokens), copied out of the batch cache; None
    when a layer is not a plain full-attention layer (a sliding window drops positions: the episode is re-read)."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) not in (DynamicLayer, PreallocatedLayer) for layer in layers):
        return None
    keep = attended.bool()
    return EpisodeCache([(layer.keys[b][:, keep], layer.values[b][:, keep]) for layer in layers])


def batch_cache(stores: list[EpisodeCache | None], keep: list[int], width: int) -> DynamicCache | None:
    """A cache of `width` positions per row: row i's first keep[i] stored positions right-aligned in it, zeros
    (never attended: the attention mask is 0 there) before. None when no row keeps any."""
    if width == 0:
        return None
    like = next(s for s, k in zip(stores, keep) if s is not None and k > 0)
    layers = []
    for layer in range(len(like.layers)):
        h, _, d = like.layers[layer][0].shape
        tensors = []
        for j in (0, 1):  # keys, values
            t = like.layers[layer][j].new_zeros((len(stores), h, width, d))
            for i, (store, k) in enumerate(zip(stores, keep)):
                if k > 0:
                    t[i, :, width - k :] = store.layers[layer][j][:, :k]
            tensors.append(t)
        layers.append(tuple(tensors))
    return DynamicCache(ddp_cache_data=layers)


@torch.no_grad()
def decode_turn(
    model: torch.nn.Module,
    seqs: list[list[int]],
    stores: list[EpisodeCache | None],
    max_new_tokens: int,
    temperature: float,
    stop_ids: list[int],
    pad_id: int,
    greedy: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    generators: list[torch.Generator] | None = None,
    prepack: bool = True,
) -> tuple[Decoded, list[EpisodeCache | None]]:
    """One turn of each row: seqs[i] is the episode's whole sequence so far, stores[i] the cache of its first
    stores[i].length tokens (None: nothing cached). Returns the sampled turns (as decode_groups with group_size 1)
    and, for each row that stopped, the cache of its sequence plus its turn without the stop token; None for a row
    that did not stop (its episode ends)."""
    n, dev = len(seqs), next(model.parameters()).device
    have = [0 if s is None else s.length for s in stores]
    if any(h > len(s) for h, s in zip(have, seqs)):
        raise ValueError("an episode's cache is longer than its sequence")
    feed = max(len(s) - h for s, h in zip(seqs, have))
    ids, mask = left_pad(seqs, pad_id)
    ids, mask = ids.to(dev), mask.to(dev)
    width = ids.shape[1]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    past = batch_cache(stores, [max(0, len(s) - feed) for s in seqs], width - feed)
    out = model(
        input_ids=ids[:, width - feed :],
        attention_mask=mask,
        position_ids=positions[:, width - feed :],
        use_cache=True,
        logits_to_keep=1,
        **(cache_kwarg(model, past) if past is not None else {}),
    )
    cache = getattr(out, "cache", None) or out.past_key_values
    preallocate(cache, width + max_new_tokens)
    caches: list[EpisodeCache | None] = [None] * n

    def keep_episode_caches(cache, stopped: torch.Tensor, rows: torch.Tensor, attn: torch.Tensor) -> None:
        for b in stopped.nonzero().flatten().tolist():
            caches[int(rows[b])] = row_cache(cache, b, attn[b])

    # one generator per episode
    loop = SamplingLoop(
        max_new_tokens,
        temperature,
        stop_ids,
        pad_id,
        greedy=greedy,
        top_k=top_k,
        top_p=top_p,
        group_size=1,
        generators=generators,
        prepack=prepack,
    )
    return sample_loop(model, out.logits[:, -1], cache, mask, loop, on_stop=keep_episode_caches), caches
