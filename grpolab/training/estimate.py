"""Before a GPU is at hand: a config's step time and memory on a named GPU, from the model's shape, the config's
lengths and the GPU's spec sheet (`grpolab bench CONFIG --estimate GPU`). An estimate, printed as one, until
`grpolab bench CONFIG` measures it on the device; every constant below is named with where it comes from.

Every completion is taken at rollout.max_new_tokens (an upper bound on a step's work). With P parameters, rows =
prompts_per_step x group_size, L = Lp + Lc, b = train.micro_batch_size, V the vocabulary:

    memory = 16 P (fp32 master weights, gradients, AdamW's two moments) + 2 P (bf16 casts kept for the step)
           + 2 P when beta > 0 (the bf16 reference)
           + b x L x layers x 34 d                      activations kept for the backward, bf16 with flash attention
                                                        and no recomputation (Korthikanti et al. 2022, eq. 1 without
                                                        the 5 a s / h attention-score term)
           + b x Lc x V x 6                             one micro-batch's bf16 logits and their fp32 chunk
           + 2 P + rows x L x layers x 2 d_kv x 2       the sampler's bf16 weights and its KV cache

    generation = max(Lc x (2 P + KV bytes of the batch at L / 2) / (bandwidth x DECODE_BANDWIDTH_SHARE),
                     generation FLOPs / (peak x DECODE_FLOP_SHARE))
    update     = (reference FLOPs + mu x policy FLOPs) / (peak x UPDATE_MFU)        (grpolab.training.flops)
    sync       = 2 P / SYNC_BYTES_PER_S

step = generation + update + sync; tokens/s = rows x L / step (the end-to-end definition of `grpolab bench`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .flops import ModelShape, step_flops

# prime-rl's benchmark table: Qwen3-0.6B full fine-tune at 16k tokens on one H100, MFU 11.1% (trainer-only)
UPDATE_MFU = 0.111
DECODE_BANDWIDTH_SHARE = 0.5  # of the spec sheet's memory bandwidth a decode step reaches (assumed)
DECODE_FLOP_SHARE = 0.5  # of the peak a batched decode reaches when compute-bound (assumed)
# grpolab's vLLM sync (weights as safetensors files in shared memory, re-read by the engine): measured 326 MB in
# 0.55 s on a 2-vCPU AMD EPYC (docs/vllm.md); a host-memory path, so taken as is for a GPU
SYNC_BYTES_PER_S = 0.6e9
HEADROOM = 0.9  # the share of the GPU's memory a run may plan for


@dataclass(frozen=True)
class GPUSpec:
    """A GPU's spec sheet: dense bf16 and fp32 FLOP/s, memory bandwidth (bytes/s), memory (bytes)."""

    label: str
    bf16: float
    fp32: float
    bandwidth: float
    memory: float


GIB = 2**30
# (name fragment of torch.cuda.get_device_name, spec): dense (no sparsity) peaks from the vendors' spec sheets, fp32 the
# non-tensor-core rate (torch runs fp32 matmuls without TF32 unless told to); the first match wins, so a more specific
# fragment comes before a shorter one
GPU_SPECS: tuple[tuple[str, GPUSpec], ...] = (
    ("H200", GPUSpec("NVIDIA H200 (SXM)", 989.4e12, 66.9e12, 4.8e12, 141e9)),
    ("H100 PCIe", GPUSpec("NVIDIA H100 PCIe", 756.5e12, 51.2e12, 2.0e12, 80e9)),
    ("H100 NVL", GPUSpec("NVIDIA H100 NVL", 835.5e12, 60.0e12, 3.9e12, 94e9)),
    ("H100", GPUSpec("NVIDIA H100 SXM", 989.4e12, 66.9e12, 3.35e12, 80e9)),
    ("A100", GPUSpec("NVIDIA A100 80GB SXM", 312e12, 19.5e12, 2.039e12, 80e9)),
    ("L40S", GPUSpec("NVIDIA L40S", 362e12, 91.6e12, 0.864e12, 48e9)),
    ("4090", GPUSpec("NVIDIA GeForce RTX 4090", 165.2e12, 82.6e12, 1.008e12, 24e9)),
)


def gpu_spec(name: str) -> GPUSpec:
    """The spec of the first GPU_SPECS entry whose fragment the name contains (case-insensitive)."""
    for fragment, spec in GPU_SPECS:
        if fragment.lower() in name.lower():
            return spec
    known = ", ".join(fragment for fragment, _ in GPU_SPECS)
    raise ValueError(f"no spec sheet for the GPU {name!r}; known: {known}")


@dataclass(frozen=True)
class RunShape:
    """The config's sizes an estimate reads."""

    prompt_len: int
    completion_len: int
    group_size: int
    prompts: int
    micro_batch: int
    mu: int
    reference: bool


def memory_bytes(shape: ModelShape, params: int, d_kv: int, run: RunShape) -> dict[str, float]:
    """The memory terms of the module docstring, in bytes, and their total."""
    length, rows = run.prompt_len + run.completion_len, run.prompts * run.group_size
    terms = {
        "training_state": 18.0 * params,
        "reference": 2.0 * params if run.reference else 0.0,
        "activations": float(run.micro_batch * length * shape.n_layers * 34 * shape.d_model),
        "logits": float(run.micro_batch * run.completion_len * shape.vocab * 6),
        "sampler": 2.0 * params + rows * length * shape.n_layers * 2 * d_kv * 2,
    }
    terms["total"] = sum(terms.values())
    return terms


def step_seconds(shape: ModelShape, params: int, d_kv: int, run: RunShape, gpu: GPUSpec) -> dict[str, float]:
    """The time terms of the module docstring, in seconds, and their total."""
    rows = run.prompts * run.group_size
    flops = step_flops(shape, [run.prompt_len] * rows, [run.completion_len] * rows, run.group_size, run.reference)
    kv_mid = rows * (run.prompt_len + run.completion_len / 2) * shape.n_layers * 2 * d_kv * 2
    read = run.completion_len * (2.0 * params + kv_mid) / (gpu.bandwidth * DECODE_BANDWIDTH_SHARE)
    terms = {
        "generation": max(read, flops["generation"] / (gpu.bf16 * DECODE_FLOP_SHARE)),
        "update": (flops["reference"] + run.mu * flops["policy"]) / (gpu.bf16 * UPDATE_MFU),
        "sync": 2.0 * params / SYNC_BYTES_PER_S,
    }
    terms["total"] = sum(terms.values())
    return terms


def estimate(shape: ModelShape, params: int, d_kv: int, run: RunShape, gpu: GPUSpec) -> dict[str, Any]:
    """Step time, tokens/s and memory of `run` on `gpu`, and whether it fits HEADROOM of the GPU's memory."""
    seconds = step_seconds(shape, params, d_kv, run, gpu)
    memory = memory_bytes(shape, params, d_kv, run)
    tokens = run.prompts * run.group_size * (run.prompt_len + run.completion_len)
    return {
        "gpu": gpu.label,
        "estimate": True,
        "definition": "every completion at rollout.max_new_tokens; constants and formulas: grpolab.training.estimate",
        "assumptions": {
            "update_mfu": UPDATE_MFU,
            "decode_bandwidth_share": DECODE_BANDWIDTH_SHARE,
            "decode_flop_share": DECODE_FLOP_SHARE,
            "sync_bytes_per_s": SYNC_BYTES_PER_S,
        },
        "step_seconds": seconds,
        "tokens_per_s": tokens / seconds["total"],
        "memory_gib": {k: v / GIB for k, v in memory.items()},
        "fits": memory["total"] <= HEADROOM * gpu.memory,
        "gpu_memory_gib": gpu.memory / GIB,
    }


def run_shape(cfg, prompt_len: int) -> RunShape:
    """A config's RunShape, at a prompt length the caller chose (the task's longest prompt, or a stated one)."""
    return RunShape(
        prompt_len=prompt_len,
        completion_len=cfg.rollout.max_new_tokens,
        group_size=cfg.rollout.group_size,
        prompts=cfg.train.prompts_per_step,
        micro_batch=cfg.train.micro_batch_size,
        mu=cfg.train.mu,
        reference=cfg.algorithm.beta > 0,
    )


def model_sizes(config: Any) -> tuple[ModelShape, int, int]:
    """(shape, parameters, d_kv) of a Llama-style transformers config (Llama, Qwen2, Qwen3, SmolLM...), counted
    without building the model; the embedding counted once when tied."""
    shape = ModelShape.from_config(config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    params = shape.n_body + shape.vocab * shape.d_model * (1 if tied else 2)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return shape, params, n_kv * head_dim


def estimate_lines(result: dict[str, Any]) -> list[str]:
    """The estimate as console lines, labelled as an estimate."""
    s, m = result["step_seconds"], result["memory_gib"]
    a = result["assumptions"]
    fits = "fits" if result["fits"] else "DOES NOT FIT"
    return [
        f"ESTIMATE for {result['gpu']} (not a measurement; `grpolab bench` on the GPU measures it)",
        f"  step {s['total']:.1f} s = generation {s['generation']:.1f} + update {s['update']:.1f} + sync "
        f"{s['sync']:.1f}; {result['tokens_per_s']:,.0f} tokens/s end to end",
        f"  memory {m['total']:.1f} GiB of {result['gpu_memory_gib']:.0f} ({fits} in {HEADROOM:.0%}): training state "
        f"{m['training_state']:.1f}, reference {m['reference']:.1f}, activations {m['activations']:.1f}, logits "
        f"{m['logits']:.1f}, sampler {m['sampler']:.1f}",
        f"  assumed: update MFU {a['update_mfu']:.1%}, decode at {a['decode_bandwidth_share']:.0%} of the memory "
        f"bandwidth, sync {a['sync_bytes_per_s'] / 1e9:.1f} GB/s; {result['definition']}",
    ]
