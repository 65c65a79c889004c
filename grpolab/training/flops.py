"""FLOP accounting of a GRPO step and this machine's matrix rate: what `grpolab bench` (grpolab.training.bench) and
the scripts under benchmarks/ (benchmarks/common.py re-exports these) count and measure against. Imports only the
standard library and torch.

FLOP accounting (multiply-add = 2 FLOPs; matrix products only: norms, softmax, rotary, sampling and the
optimizer's element-wise update are left out -- they are a few FLOPs per parameter or per activation, not per
parameter per token):

  N_body  non-embedding parameters (attention and MLP projections, norms) -- every input token meets them once
  N_head  the LM head (vocab x d_model, tied or not) -- met only at positions whose logits are needed
  attention: a token at position p (0-based) attends to p + 1 keys in every layer; QK^T and AV each cost
  2 * (p + 1) * d_attn FLOPs per layer (d_attn = n_heads * head_dim, the query width; grouped-query attention
  shrinks K/V projections, which N_body already counts, not these products). Averaged over a causal sequence of
  n_ctx tokens this is Kaplan et al.'s 2 * n_layers * n_ctx * d_attn per token.

One sequence = prompt (Lp tokens) + completion (Lc tokens, the EOS that ended it included). Producing or scoring
the completion needs the inputs at positions 0 .. Lp + Lc - 2 (the last completion token is never an input whose
output matters) and logits at the Lc positions that predict completion tokens:

  F_fwd = 2 * N_body * (Lp + Lc - 1) + 2 * N_head * Lc + 4 * n_layers * d_attn * sum_{p < Lp + Lc - 1} (p + 1)

A step with a KL reference and one policy update per rollout (mu = 1, old logprobs = the detached current ones)
must do: generation 1 F_fwd (prefill + incremental decode with a KV cache), reference 1 F_fwd, policy forward +
backward 3 F_fwd (backward = 2x forward: gradients w.r.t. activations and w.r.t. weights). Padding, finished
rows that keep decoding, logits at prompt positions, recomputation (gradient checkpointing) and extra passes are
implementation overhead and are not counted. `share_prompt=True` counts each group's prompt once (its KV cache
shared by the G completions) -- the least work possible; the default counts every sequence in full, the usual
"model FLOPs" convention.

Per token this is the familiar 2 x parameters for a forward pass (generation), 6 x parameters for forward +
backward (training), plus the attention term.
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class ModelShape:
    """What FLOP counting needs to know about a decoder-only transformer."""

    n_layers: int
    d_model: int
    d_attn: int  # n_heads * head_dim (query width)
    vocab: int
    n_body: int  # non-embedding parameters
    n_head: int  # LM head parameters (vocab * d_model [+ bias]); counted even when tied to the embedding

    @classmethod
    def from_config(cls, config: Any) -> "ModelShape":
        """From a Llama-style config (Llama, Mistral, Qwen2, SmolLM...): gated MLP, RMSNorm, optional biases."""
        d, n_layers = config.hidden_size, config.num_hidden_layers
        n_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or d // n_heads
        n_kv = getattr(config, "num_key_value_heads", None) or n_heads
        d_attn, d_kv, ff = n_heads * head_dim, n_kv * head_dim, config.intermediate_size
        attn_bias = bool(getattr(config, "attention_bias", False))
        mlp_bias = bool(getattr(config, "mlp_bias", False))
        per_layer = (
            d * d_attn
            + 2 * d * d_kv
            + d_attn * d  # q, k, v, o projections
            + (d_attn + 2 * d_kv + d if attn_bias else 0)
            + 3 * d * ff
            + (2 * ff + d if mlp_bias else 0)  # gate, up, down
            + 2 * d  # input and post-attention RMSNorm weights
        )
        n_body = n_layers * per_layer + d  # + final norm
        return cls(
            n_layers=n_layers,
            d_model=d,
            d_attn=d_attn,
            vocab=config.vocab_size,
            n_body=n_body,
            n_head=config.vocab_size * d,
        )

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> "ModelShape":
        """Counted from the parameters themselves (any architecture whose config names these sizes)."""
        config = model.config
        emb = model.get_input_embeddings().weight
        head = model.get_output_embeddings()
        unique = {id(p): p.numel() for p in model.parameters()}
        n_body = sum(unique.values()) - emb.numel()
        n_head = head.weight.numel() + (head.bias.numel() if getattr(head, "bias", None) is not None else 0)
        if id(head.weight) != id(emb):  # untied: the head's own parameters are not body parameters either
            n_body -= n_head
        n_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
        return cls(
            n_layers=config.num_hidden_layers,
            d_model=config.hidden_size,
            d_attn=n_heads * head_dim,
            vocab=emb.shape[0],
            n_body=n_body,
            n_head=n_head,
        )


def _keys(start: int, stop: int) -> int:
    """sum_{p = start}^{stop - 1} (p + 1): keys attended by the tokens at positions start .. stop - 1."""
    return (stop * (stop + 1) - start * (start + 1)) // 2 if stop > start else 0


def span_flops(shape: ModelShape, start: int, stop: int, logits: int) -> float:
    """Forward FLOPs of the input tokens at positions start .. stop - 1 (earlier ones cached), with `logits`
    positions through the LM head."""
    tokens = max(stop - start, 0)
    return (
        2.0 * shape.n_body * tokens
        + 2.0 * shape.n_head * logits
        + 4.0 * shape.n_layers * shape.d_attn * _keys(start, stop)
    )


def sequence_forward_flops(shape: ModelShape, prompt_len: int, completion_len: int) -> float:
    """F_fwd of one prompt + completion (see the module docstring)."""
    if completion_len < 1 or prompt_len < 1:
        raise ValueError(f"expected prompt_len >= 1 and completion_len >= 1, got {prompt_len}, {completion_len}")
    return span_flops(shape, 0, prompt_len + completion_len - 1, completion_len)


def group_forward_flops(
    shape: ModelShape, prompt_len: int, completion_lens: Sequence[int], share_prompt: bool
) -> float:
    """Forward FLOPs of one group (one prompt, several completions); the prompt once when share_prompt."""
    if not share_prompt:
        return sum(sequence_forward_flops(shape, prompt_len, lc) for lc in completion_lens)
    if prompt_len < 1 or any(lc < 1 for lc in completion_lens):
        raise ValueError("expected prompt_len >= 1 and every completion_len >= 1")
    prompt = span_flops(shape, 0, prompt_len, 1)  # the prompt's last position predicts completion token 0
    rest = sum(span_flops(shape, prompt_len, prompt_len + lc - 1, lc - 1) for lc in completion_lens)
    return prompt + rest


def step_flops(
    shape: ModelShape,
    prompt_lens: Sequence[int],
    completion_lens: Sequence[int],
    group_size: int,
    with_reference: bool = True,
    share_prompt: bool = False,
) -> dict[str, float]:
    """Matrix FLOPs one GRPO step must do, by phase: generation, reference, policy (forward + backward), total.

    prompt_lens / completion_lens: one entry per sequence, group-major (G consecutive sequences share a prompt;
    only the first prompt length of each group is read when share_prompt).
    """
    if len(prompt_lens) != len(completion_lens) or len(prompt_lens) % group_size:
        raise ValueError(
            f"expected equal-length lists of whole groups of {group_size}, got {len(prompt_lens)} and {len(completion_lens)}"
        )
    fwd = 0.0
    for g in range(0, len(prompt_lens), group_size):
        fwd += group_forward_flops(
            shape, int(prompt_lens[g]), [int(x) for x in completion_lens[g : g + group_size]], share_prompt
        )
    out = {"generation": fwd, "reference": fwd if with_reference else 0.0, "policy": 3.0 * fwd}
    out["total"] = out["generation"] + out["reference"] + out["policy"]
    return out


# --------------------------------------------------------------------------------------------- machine


def cpu_features() -> dict[str, Any]:
    """CPU model and the matrix-relevant flags (AVX-512, AVX512-BF16, AMX) from /proc/cpuinfo, and what torch sees."""
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
                elif line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    wanted = ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"]
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch
        capability = "unknown"
    return {
        "model": model,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_cpu_capability": capability,
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "flags": {f: f in flags for f in wanted},
    }


def matmul_rate(
    m: int,
    k: int,
    n: int,
    dtype: torch.dtype,
    min_seconds: float = 0.5,
    min_reps: int = 3,
    device: torch.device | str = "cpu",
) -> float:
    """Achieved FLOP/s (2 m k n per product) of torch.matmul([m x k], [k x n]) in `dtype` on `device` (best of timed
    repetitions after a warm-up; a CUDA device is synchronised around each)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=g).to(device=device, dtype=dtype)
    out = torch.empty(m, n, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    torch.matmul(a, b, out=out)
    sync()
    first = time.perf_counter() - t0
    if (
        first >= min_seconds
    ):  # a dtype this slow here (bf16 without bf16 units: ~100 s per call) is measured by one call
        return 2.0 * m * k * n / first
    torch.matmul(a, b, out=out)
    sync()
    best, reps, start = math.inf, 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        torch.matmul(a, b, out=out)
        sync()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return 2.0 * m * k * n / best
