"""The key/value cache of a Hugging Face model as the decode loop and the training passes use it.

`cache_kwarg`: the forward's argument name (shared by the decode loop and the training passes, which run a prompt
once and its completions against its cache). `preallocate`: the decode loop's cache grows in place.

transformers' DynamicLayer appends a step's keys and values with ``torch.cat``, which copies the whole cache every
step: at context c that is 2 * n_layers * B * c * n_kv_heads * head_dim elements written per token, O(c^2) over a
completion. A `PreallocatedLayer` holds buffers [B, H, capacity, D] allocated once and writes each step's entries
into them; its keys/values are the views [:, :, :length] of those buffers. The attention reads the same numbers in
the same order (tested: same tokens and logprobs with and without). A finished row leaving the batch copies the
kept rows' filled positions once (`batch_select_indices`), as before. Memory: the buffers are allocated for the
prompt plus max_new_tokens up front, but on a CPU the pages of the unwritten tail stay virtual until written.
"""

from __future__ import annotations

import inspect

import torch

try:  # transformers >= 4.56 keeps one layer object per model layer
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - older transformers: decoded as it is
    DynamicLayer = None


def cache_kwarg(model, cache) -> dict:
    """transformers >= 5.2x names the argument `cache`; earlier releases `past_key_values`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps forward(*args, **kw)
    params = inspect.signature(base.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}


if DynamicLayer is not None:

    class PreallocatedLayer(DynamicLayer):
        """A DynamicLayer whose keys/values [B, H, length, D] are views of buffers [B, H, capacity, D] made once;
        `update` writes the new entries in place (and doubles the buffers should a step ever pass capacity)."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
            super().__init__()
            self.length, self.device, self.is_initialized = keys.shape[-2], keys.device, True
            self._keys = _buffer(keys, max(capacity, self.length))
            self._values = _buffer(values, max(capacity, self.length))
            self._views()

        def _views(self) -> None:
            self.keys, self.values = self._keys[:, :, : self.length], self._values[:, :, : self.length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            end = self.length + key_states.shape[-2]
            if end > self._keys.shape[-2]:
                self._keys, self._values = _buffer(self.keys, 2 * end), _buffer(self.values, 2 * end)
            self._keys[:, :, self.length : end] = key_states
            self._values[:, :, self.length : end] = value_states
            self.length = end
            self._views()
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._rebuffer(self.keys[indices], self.values[indices])

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._rebuffer(self.keys.repeat_interleave(repeats, dim=0), self.values.repeat_interleave(repeats, dim=0))

        def _rebuffer(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            """New buffers of the same capacity holding these entries: only the filled positions are copied, so the
            unwritten tail is never touched (a CPU allocation stays virtual until written)."""
            capacity = self._keys.shape[-2]
            self._keys, self._values = _buffer(keys, capacity), _buffer(values, capacity)
            self._views()

        def crop(self, tokens_to_remove: int) -> None:
            """Drop the last -tokens_to_remove positions (DynamicLayer's convention: a negative count)."""
            self.length = max(0, self.length + min(tokens_to_remove, 0))
            self._views()

        def reset(self) -> None:
            self.length = 0
            self._views()


def _buffer(entries: torch.Tensor, capacity: int) -> torch.Tensor:
    """A [B, H, capacity, D] buffer holding `entries` [B, H, n, D] in its first n positions (the rest unset)."""
    b, h, n, d = entries.shape
    out = entries.new_empty((b, h, capacity, d))
    out[:, :, :n] = entries
    return out


def preallocate(cache, capacity: int) -> int:
    """Swap each filled DynamicLayer of `cache` (exactly that class) for a PreallocatedLayer of `capacity`
    positions holding the same entries; returns how many were swapped (0 for any other cache)."""
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or not isinstance(layers, list):
        return 0
    swapped = 0
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            layers[i] = PreallocatedLayer(layer.keys, layer.values, capacity)
            swapped += 1
    return swapped
