"""Attention in float32 inside bf16 autocast: the `sdpa_fp32` attention implementation.

Under bf16 autocast the projections hand SDPA bfloat16 queries, keys and values. On CPU, PyTorch's bf16 SDPA
backward is far slower than its float32 one (it has no fast bf16 kernel on most CPUs), so on a machine where bf16
matrix products pay (AMX or AVX-512-BF16) the attention backward can eat the gain. ``sdpa_fp32`` computes

    O = softmax(Q K^T * scale + mask) V    with Q, K, V upcast to float32, O cast back to bfloat16

i.e. exactly what float32 SDPA gives on the bf16-rounded inputs; every other product stays in bf16. It is the
standard SDPA in every other respect (masks, grouped-query heads, causal flag), registered with transformers'
``AttentionInterface`` (and SDPA's mask builder) under its own name. grpolab switches a policy to it when the
update runs in bf16 autocast on CPU (grpolab.training.trainer; ``train.attention_fp32``).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "sdpa_fp32"
SDPA_NAMES = ("sdpa", NAME)  # implementations that take a boolean 4-D mask as given (packing needs one)


def sdpa_fp32_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """SDPA on float32 copies of Q, K, V (autocast off inside), the output back in the query's dtype."""
    dtype = query.dtype
    mask = attention_mask if attention_mask is None or attention_mask.dtype == torch.bool else attention_mask.float()
    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), mask, **kwargs)
    return out.to(dtype), weights


def register() -> None:
    """Make ``sdpa_fp32`` known to transformers (idempotent)."""
    AttentionInterface.register(NAME, sdpa_fp32_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_fp32_attention(model) -> bool:
    """Switch an SDPA model to ``sdpa_fp32``; returns False (and changes nothing) for any other attention."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    model.set_attn_implementation(NAME)
    return True
