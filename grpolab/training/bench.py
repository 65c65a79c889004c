"""`grpolab bench CONFIG`: how fast a config's run goes on this machine and how much memory it takes, measured on the
config's own model and shapes before anyone launches it.

Two throughputs, never compared with each other (each only with its own kind of anchor):

- **trainer-only**: the policy update alone on synthetic batches at the config's lengths -- forward + backward +
  optimizer step of the real model through the real updater (grpolab.training.update), prompts_per_step x
  group_size sequences of (the longest prompt seen + rollout.max_new_tokens) tokens, micro-batched by
  train.micro_batch_size, mu passes; old and reference log-probabilities given (their no-grad passes are not part
  of it). tokens/s = mu x sequences x sequence length / seconds (prime-rl's "trainer" figure).
- **end-to-end**: real GRPO steps of the real Trainer -- generation, rewards, log-probabilities, update, weight
  sync. tokens/s = (prompt + completion tokens of the trained batch) / step seconds, the run's own
  throughput/tokens_per_s (NeMo-RL's figure, per GPU). The first step pays one-time costs (allocations, the
  optimizer's moments); with --steps >= 2 the steps after it are reported (their median).

MFU = model FLOPs / seconds / peak FLOP/s. Model FLOPs (grpolab.training.flops; matrix products only, padding and
recomputation not counted): per sequence F_fwd = 2 N_body (Lp + Lc - 1) + 2 N_head Lc + attention -- 2 x params
per token for a forward pass (generation, reference, pi_old), 3 F_fwd (6 x params per token) for forward +
backward, 2 F_fwd for LoRA (the frozen weights need no weight gradients). The peak: on a CPU measured by a matmul
probe at the run's precision (the best of a model-shaped and a square product); on a GPU the spec sheet's dense
peak (GPU_PEAKS; a probe when the GPU is not in the table). Peak memory: the process's RSS high-water mark on a CPU
(resource.getrusage: model loading included, never reset), torch.cuda.max_memory_allocated on a GPU (reset
before each phase).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..config import Config
from ..rollout.base import Rollout
from .estimate import GPU_SPECS
from .flops import ModelShape, cpu_features, matmul_rate, step_flops
from .memory_fit import memory_fit, memory_mib, refuse_if_too_big, reset_memory, synthetic_rollout
from .trainer import Trainer

# the spec sheets of grpolab.training.estimate (one table): (name fragment, label, dense peaks); fp16 runs on the same
# tensor cores at the bf16 rate on every GPU of the table
GPU_PEAKS = tuple(
    (fragment, spec.label, {"bf16": spec.bf16, "fp16": spec.bf16, "fp32": spec.fp32}) for fragment, spec in GPU_SPECS
)

# published figures, each with its definition and hardware (issue 64 cites them); printed beside, never a verdict
ANCHORS: tuple[dict[str, Any], ...] = (
    {
        "source": "prime-rl benchmark table",
        "kind": "trainer-only",
        "setting": "Qwen3-0.6B full fine-tune, 16k-token sequences",
        "hardware": "1x H100",
        "tokens_per_s": 11_900,
        "mfu": 0.111,
        "peak_memory_gib": 12.5,
    },
    {
        "source": "prime-rl benchmark table",
        "kind": "trainer-only",
        "setting": "Qwen3-4B LoRA",
        "hardware": "H100 (the table's)",
        "tokens_per_s": 6_200,
        "mfu": 0.217,
    },
    {
        "source": "NeMo-RL",
        "kind": "end-to-end",
        "setting": "Llama-3.1-8B GRPO, synchronous; 92.8 s a step",
        "hardware": "16x H100",
        "tokens_per_s_per_gpu": 1_581,
    },
    {
        "source": "NeMo-RL",
        "kind": "end-to-end",
        "setting": "Llama-3.1-8B GRPO, one step off-policy",
        "hardware": "16x H100",
        "tokens_per_s_per_gpu": 2_478,
    },
)

DTYPE = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
NAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def device_name(device: torch.device) -> str:
    """The CPU's model name (/proc/cpuinfo) or the GPU's (torch.cuda.get_device_name)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_features()["model"]


def peak_flops(device: torch.device, dtype: torch.dtype, d_model: int, d_ff: int, tokens: int) -> dict[str, Any]:
    """{"flop_per_s", "source"}: the device's peak at `dtype`. A GPU in GPU_PEAKS: its spec sheet's dense figure.
    Otherwise measured: the best FLOP/s (2 m k n / seconds) of two products -- the model's training MLP product
    [min(tokens, 2048) x d_model] @ [d_model x d_ff] and a square 1024 one -- each the best of repetitions over
    ~0.3 s after a warm-up (grpolab.training.flops.matmul_rate)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for fragment, label, peaks in GPU_PEAKS:
            if fragment in name:
                return {"flop_per_s": peaks[NAME[dtype]], "source": f"spec sheet: {label}, {NAME[dtype]} dense"}
    shapes = [(max(1, min(tokens, 2048)), d_model, d_ff), (1024, 1024, 1024)]
    rates = [matmul_rate(m, k, n, dtype, min_seconds=0.3, device=device) for m, k, n in shapes]
    probe = " and ".join(f"[{m} x {k}] @ [{k} x {n}]" for m, k, n in shapes)
    return {"flop_per_s": max(rates), "source": f"matmul probe, {NAME[dtype]}: the best of {probe}"}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def passes(cfg: Config, has_reference: bool) -> dict[str, float]:
    """How many F_fwd each phase of one GRPO step costs per sequence: generation 1, reference 1 (beta > 0),
    pi_old 1 (a no-grad pass when mu > 1 or minibatches > 1), update mu x 3 (forward + backward; LoRA mu x 2)."""
    t = cfg.train
    backward = 2.0 if cfg.model.lora.rank > 0 else 3.0
    return {
        "generation": 1.0,
        "reference": 1.0 if has_reference else 0.0,
        "old_logprobs": 0.0 if (t.mu == 1 and t.minibatches == 1) else 1.0,
        "update": t.mu * backward,
    }


def batch_flops(shape: ModelShape, rollout: Rollout, group_size: int, cfg: Config, has_reference: bool) -> float:
    """Model FLOPs of one real step on `rollout`: sum over its sequences of F_fwd(Lp, Lc) x the passes of
    `passes` (generation + reference + pi_old + update)."""
    prompt = rollout.prompt_mask.sum(-1).clamp(min=1).tolist()
    completion = rollout.completion_mask.sum(-1).clamp(min=1).tolist()
    forward = step_flops(shape, prompt, completion, group_size, with_reference=False)["generation"]
    return forward * sum(passes(cfg, has_reference).values())


def end_to_end(trainer: Trainer, shape: ModelShape, steps: int) -> dict[str, Any]:
    """`steps` real steps of `trainer` (collect, then update + sync: Trainer.update_step); the ones after the first
    reported (all when steps = 1). MFU is added by the caller, once the peak is known."""
    cfg, device = trainer.cfg, trainer.device
    reset_memory(device)
    records = []
    for _ in range(steps):
        synchronize(device)
        t0 = time.perf_counter()
        batch = trainer.collect()
        metrics, _ = trainer.update_step(batch, t0)
        synchronize(device)
        seconds = time.perf_counter() - t0
        r = batch.rollout
        flops = batch_flops(shape, r, cfg.rollout.group_size, cfg, trainer.reference is not None)
        tokens = float(r.prompt_mask.sum() + r.completion_mask.sum())
        records.append(
            {
                "seconds": seconds,
                "rollout_s": metrics["time/rollout_s"],
                "update_s": metrics["time/update_s"],
                "tokens": tokens,
                "tokens_per_s": tokens / seconds,
                "flops": flops,
                "truncated_frac": metrics["completion/truncated_frac"],
            }
        )
    kept = records[1:] or records
    seconds = statistics.median(r["seconds"] for r in kept)
    tokens_per_s = statistics.median(r["tokens_per_s"] for r in kept)
    achieved = statistics.median(r["flops"] / r["seconds"] for r in kept)
    return {
        "definition": "real GRPO steps of the Trainer (generation, rewards, log-probabilities, update, weight sync): "
        "prompt + completion tokens of the trained batch / step seconds; the median of the steps after the first",
        "prompts": cfg.train.prompts_per_step,
        "group_size": cfg.rollout.group_size,
        "steps": records,
        "step_s": seconds,
        "tokens_per_s": tokens_per_s,
        "flops_per_step": statistics.median(r["flops"] for r in kept),
        "achieved_flop_per_s": achieved,
        "peak_memory_mib": memory_mib(device),
        "max_prompt_tokens": int(max(batch.rollout.prompt_mask.sum(-1).max().item(), 1)),
    }


def trainer_only(trainer: Trainer, shape: ModelShape, prompt_len: int, peak: float, repeats: int) -> dict[str, Any]:
    """The policy update alone (PolicyUpdater.update) on a synthetic batch at the config's lengths: one warm-up call
    (it allocates the optimizer's moments), then `repeats` timed ones (their median).

    tokens = mu x rows x (Lp + Lc); FLOPs = rows x passes["update"] x F_fwd(Lp, Lc)."""
    cfg, device = trainer.cfg, trainer.device
    g, rows, lc = (
        cfg.rollout.group_size,
        cfg.train.prompts_per_step * cfg.rollout.group_size,
        cfg.rollout.max_new_tokens,
    )
    rollout = synthetic_rollout(rows, prompt_len, lc, shape.vocab, device)
    rollout.group = torch.arange(rows, device=device) // g
    advantages = torch.tensor([1.0, -1.0], device=device).repeat(rows // 2 + 1)[:rows]
    valid = torch.ones(rows, dtype=torch.bool, device=device)
    # pi_old / reference / sampler log-probs as a step would hand them over (one untimed no-grad pass: ratios 1)
    given = trainer.updater.logprobs_no_grad(trainer.policy, rollout, trainer.update_precision)
    rollout.sampler_logprobs = given
    old = None if passes(cfg, False)["old_logprobs"] == 0 else given
    ref = given if trainer.reference is not None else None
    reset_memory(device)
    times = []
    for i in range(repeats + 1):
        synchronize(device)
        t0 = time.perf_counter()
        trainer.updater.update(rollout, advantages, valid, ref_logp=ref, old_logp=old, step=i)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times[1:])
    forward = step_flops(shape, [prompt_len] * rows, [lc] * rows, g, with_reference=False)["generation"]
    flops = forward * passes(cfg, False)["update"]
    tokens = cfg.train.mu * rows * (prompt_len + lc)
    return {
        "definition": "forward + backward + optimizer step of the real model on synthetic batches at the config's "
        "lengths (old and reference log-probabilities given): mu x sequences x sequence length / seconds",
        "sequences": rows,
        "sequence_length": prompt_len + lc,
        "prompt_tokens": prompt_len,
        "completion_tokens": lc,
        "micro_batch_size": cfg.train.micro_batch_size,
        "mu": cfg.train.mu,
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "flops": flops,
        "achieved_flop_per_s": flops / seconds,
        "mfu": flops / seconds / peak,
        "peak_memory_mib": memory_mib(device),
    }


def run_bench(
    cfg: Config, steps: int = 2, repeats: int = 1, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Measure `cfg` on this machine: the memory fit first (grpolab.training.memory_fit; a micro-batch that would not
    fit is refused, GrpolabError), then end-to-end (`steps` real steps), then trainer-only (`repeats` timed updates
    on synthetic batches). The probe's and trainer-only's updates change the weights (by a few steps at the
    config's learning rate): the trainer is thrown away after. A temporary run directory; nothing is written to
    run.output_dir."""
    say = progress or (lambda message: None)
    with tempfile.TemporaryDirectory(prefix="grpolab-bench-") as tmp, Trainer(cfg, Path(tmp), progress=say) as trainer:
        device, precision = trainer.device, trainer.update_precision
        shape = ModelShape.from_model(trainer.policy)
        lp = max(len(trainer.collector.prompt_ids(p)) for p in trainer.train_problems[:64])
        say(f"memory fit: updates at micro-batches 1, 2, 4 of {lp + cfg.rollout.max_new_tokens} tokens")
        fit = memory_fit(trainer, (lp, cfg.rollout.max_new_tokens))  # first: before the run's own allocations
        refuse_if_too_big(fit)
        say(f"end-to-end: {steps} real step(s)")
        e2e = end_to_end(trainer, shape, steps)
        say(f"measuring this {device.type}'s peak FLOP/s")
        d_ff = getattr(trainer.policy.config, "intermediate_size", 4 * shape.d_model)
        tokens = cfg.train.micro_batch_size * (e2e["max_prompt_tokens"] + cfg.rollout.max_new_tokens)
        peaks = {
            p: peak_flops(device, DTYPE[p], shape.d_model, d_ff, tokens)
            for p in dict.fromkeys([precision, NAME[DTYPE[trainer.sampling_dtype]]])
        }
        e2e["mfu"] = e2e["achieved_flop_per_s"] / max(v["flop_per_s"] for v in peaks.values())
        say(f"trainer-only: {repeats + 1} updates on synthetic batches")
        solo = trainer_only(trainer, shape, e2e["max_prompt_tokens"], peaks[precision]["flop_per_s"], repeats)
        return {
            "model": cfg.model.name,
            "parameters": shape.n_body + shape.n_head,
            "shape": {
                "n_body": shape.n_body,
                "n_head": shape.n_head,
                "layers": shape.n_layers,
                "d_model": shape.d_model,
            },
            "device": {"type": device.type, "name": device_name(device), "threads": torch.get_num_threads()},
            "precision": {"update": precision, "sampling": trainer.sampling_dtype},
            "peak": peaks,
            "flops_per_token": "generation 2 x params, training 6 x params (LoRA 4 x), plus attention "
            "4 x layers x d_attn x (position + 1); grpolab.training.flops",
            "memory_fit": fit,
            "trainer_only": solo,
            "end_to_end": {**e2e, "mfu_against": "the peak of the faster of the update's and the sampler's precisions"},
            "anchors": list(ANCHORS),
        }


def si(x: float) -> str:
    """1234567 -> '1.23M' (k, M, G, T)."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def anchor_line(a: dict[str, Any]) -> str:
    """One published figure with its definition and hardware."""
    figures = [f"{a['tokens_per_s']:,} tokens/s"] if "tokens_per_s" in a else []
    figures += [f"{a['tokens_per_s_per_gpu']:,} tokens/s per GPU"] if "tokens_per_s_per_gpu" in a else []
    figures += [f"MFU {a['mfu']:.1%}"] if "mfu" in a else []
    figures += [f"{a['peak_memory_gib']} GiB"] if "peak_memory_gib" in a else []
    return f"  anchor  {a['source']} ({a['kind']}): {a['setting']}, {a['hardware']}: {', '.join(figures)}"


def bench_lines(r: dict[str, Any]) -> list[str]:
    """The bench's result as plain lines: the machine and its peak, trainer-only and end-to-end each with its
    definition and its own kind of anchor, and what the units mean."""
    d, solo, e2e = r["device"], r["trainer_only"], r["end_to_end"]
    memory = "RSS high-water mark" if d["type"] == "cpu" else "max_memory_allocated"
    lines = [
        f"model   {r['model']} ({si(r['parameters'])} parameters, body + head)",
        f"device  {d['type']}: {d['name']} ({d['threads']} threads); update {r['precision']['update']}, "
        f"sampling {r['precision']['sampling']}",
    ]
    lines += [f"peak    {si(p['flop_per_s'])}FLOP/s {name} ({p['source']})" for name, p in r["peak"].items()]
    fit = r["memory_fit"]
    lines += [
        "",
        f"memory fit    micro-batch {fit['micro_batch_size']} of {fit['sequence_length']} tokens: about "
        f"{fit['predicted_peak_mib']:,.0f} MiB (base {fit['base_mib']:,.0f} + {fit['micro_batch_size']} x "
        f"{fit['per_sequence_mib']:,.1f} a sequence) of {fit['headroom']:.0%} of {fit['capacity_mib']:,.0f} MiB; "
        f"the largest that fits: {fit['largest_micro_batch']:,}",
        "",
        f"trainer-only  {solo['definition']}",
        f"  {solo['sequences']} sequences x {solo['sequence_length']} tokens (prompt {solo['prompt_tokens']} + "
        f"completion {solo['completion_tokens']}), micro-batch {solo['micro_batch_size']}, mu {solo['mu']}",
        f"  {solo['tokens_per_s']:,.0f} tokens/s   MFU {solo['mfu']:.1%}   {solo['seconds']:.2f} s an update   "
        f"peak memory {solo['peak_memory_mib']:,.0f} MiB ({memory})",
        *[anchor_line(a) for a in r["anchors"] if a["kind"] == "trainer-only"],
        "",
        f"end-to-end    {e2e['definition']}",
        f"  {e2e['prompts']} prompts x {e2e['group_size']} completions, {len(e2e['steps'])} step(s)",
        f"  {e2e['tokens_per_s']:,.0f} tokens/s   MFU {e2e['mfu']:.1%}   {e2e['step_s']:.2f} s a step (generation "
        f"{e2e['steps'][-1]['rollout_s']:.2f} s, update {e2e['steps'][-1]['update_s']:.2f} s)   "
        f"peak memory {e2e['peak_memory_mib']:,.0f} MiB ({memory})",
        *[anchor_line(a) for a in r["anchors"] if a["kind"] == "end-to-end"],
        "",
        f"MFU = model FLOPs / seconds / peak; FLOPs per token: {r['flops_per_token']}. Trainer-only and end-to-end "
        "measure different things: compare each only with its own kind.",
    ]
    return lines
