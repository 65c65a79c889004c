"""The training policy's attention on a CPU: float32 inside bf16 autocast, and grouped heads in deterministic passes.

Two implementations registered with transformers' ``AttentionInterface`` (and SDPA's mask builder), each the
standard SDPA in every respect it does not name (masks, grouped-query heads, causal flag):

- ``sdpa_fp32`` (bf16 runs, ``speed.attention_fp32``): on a CPU the bf16 SDPA backward is far slower than the float32
  one, so it computes  O = softmax(Q K^T * scale + mask) V  with Q, K, V upcast to float32 and O cast back to
  bfloat16 -- float32 SDPA on the bf16-rounded inputs; every other product stays in bf16.
- ``sdpa_grouped`` (deterministic runs without ``sdpa_fp32``): SDPA as it is, existing only for what follows.

Inside ``grouped_passes()`` (a deterministic CPU run's training passes: grpolab.training.reproducibility) both use
``grouped_attention`` instead of SDPA's math backend, which repeats every key/value head for each of its query heads;
elsewhere (sampling, bf16 inputs, a mask it does not take: none, float, per head) they call SDPA. The trainer
switches a CPU policy to one of them after the sampler and reference copies are made. Measurements:
docs/performance.md, "Attention in float32 under bf16" and "Levers" (grouped heads).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "sdpa_fp32"
GROUPED = "sdpa_grouped"
SDPA_NAMES = ("sdpa", NAME, GROUPED)  # implementations that take a boolean 4-D mask as given (packing needs one)

_grouped = {"on": False}  # a plain global, not a ContextVar: torch.compile can guard on it


@contextlib.contextmanager
def grouped_passes() -> Iterator[None]:
    """Within: the registered implementations compute attention with ``grouped_attention`` where it applies."""
    before, _grouped["on"] = _grouped["on"], True
    try:
        yield
    finally:
        _grouped["on"] = before


def grouped_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """O = softmax(Q K^T * scale + M) V for grouped-query heads, without repeating K and V.

    query [B, H, L, D], key [B, Hkv, S, D], value [B, Hkv, S, Dv] with H = G * Hkv, query head h reading key/value
    head h // G (transformers' order); mask boolean [B or 1, 1, L, S] (True = attend) or None. The G query heads
    of one key/value head are one [G * L, D] block (one scaled copy of Q) multiplied by that head's K once; the
    mask is broadcast over the G heads, not copied. A row that attends to nothing gives 0, as SDPA's math backend
    does. Returns O [B, H, L, Dv].
    """
    b, h, length, d = query.shape
    kv_heads, s = key.shape[1], key.shape[2]
    g = h // kv_heads
    q = (query * scale).reshape(b, kv_heads, g * length, d)
    scores = (q @ key.transpose(-1, -2)).view(b, kv_heads, g, length, s)
    empty = None
    if mask is not None:
        keep = mask.unsqueeze(2)  # [B or 1, 1, 1, L, S]
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        empty = ~keep.any(-1, keepdim=True)  # [B or 1, 1, 1, L, 1]: rows that attend to nothing
    out = (scores.softmax(-1).view(b, kv_heads, g * length, s) @ value).view(b, kv_heads, g, length, -1)
    if empty is not None and bool(empty.any()):
        out = out.masked_fill(empty, 0.0)
    return out.view(b, h, length, value.shape[-1])


def _grouped_applies(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, kwargs: dict) -> bool:
    """The passes and inputs ``grouped_attention`` takes: inside ``grouped_passes``; float32 / float64 inputs with
    autocast off (SDPA's math backend upcasts half precision: this path does not); no dropout, bias or softcap;
    a boolean mask [B or 1, 1, L, S] shared by the heads."""
    if (
        not _grouped["on"]
        or query.dtype not in (torch.float32, torch.float64)
        or torch.is_autocast_enabled(query.device.type)
    ):
        return False
    if (
        kwargs.get("dropout")
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or query.shape[1] % key.shape[1]
    ):
        return False
    return (
        mask is not None
        and mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[1] == 1
        and mask.shape[0] in (1, query.shape[0])
        and mask.shape[-2:] == (query.shape[2], key.shape[2])
    )


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    upcast: bool,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    dtype = query.dtype
    mask = attention_mask
    if upcast and mask is not None and mask.dtype != torch.bool:
        mask = mask.float()
    with torch.autocast(query.device.type, enabled=False) if upcast else contextlib.nullcontext():
        q, k, v = (query.float(), key.float(), value.float()) if upcast else (query, key, value)
        if _grouped_applies(q, k, mask, kwargs):
            scale = kwargs.get("scaling") or q.shape[-1] ** -0.5
            out = grouped_attention(q, k, v, mask, scale).transpose(1, 2).contiguous()  # [B, L, H, D] as SDPA's
        else:
            out, _ = sdpa_attention_forward(module, q, k, v, mask, **kwargs)
    return out.to(dtype), None


def sdpa_fp32_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention on float32 copies of Q, K, V (autocast off inside), the output back in the query's dtype."""
    return _attention(module, query, key, value, attention_mask, True, **kwargs)


def sdpa_grouped_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """SDPA, or ``grouped_attention`` inside ``grouped_passes()``."""
    return _attention(module, query, key, value, attention_mask, False, **kwargs)


def register() -> None:
    """Make both implementations known to transformers (idempotent)."""
    for name, fn in ((NAME, sdpa_fp32_forward), (GROUPED, sdpa_grouped_forward)):
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)


def use_training_attention(model, fp32_inside_bf16: bool) -> str | None:
    """Switch an SDPA model to ``sdpa_fp32`` (fp32_inside_bf16) or ``sdpa_grouped``; returns the name, or None
    (and changes nothing) for any other attention."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return None
    register()
    name = NAME if fp32_inside_bf16 else GROUPED
    model.set_attn_implementation(name)
    return name if model.config._attn_implementation == name else None
