"""Memory fit: the largest train.micro_batch_size this machine's memory holds for a config, from a short measured
probe, and the refusal of a config whose micro-batch would not fit (`grpolab bench` probes before anything else).

The update's peak memory is linear in the micro-batch b:

    peak(b) = base + b x per_sequence

base: the weights, the sampler's copy, gradients and the optimizer's moments; per_sequence: one sequence's
activations (and logits) at the config's length (the longest prompt of a sample of the task + rollout.max_new_tokens),
kept for the backward. The probe: one warm-up update at b = 1 (it allocates the moments), then one update at
b = 2 and one at b = 4 (each on one group of the config's group size, micro-batched by b):

    per_sequence = (peak(4) - peak(2)) / 2        base = peak(2) - 2 per_sequence

On a CPU peak is the process's RSS high-water mark (VmHWM), set back to the current RSS before each update
(/proc/self/clear_refs), so an earlier, larger peak of a long-lived process does not hide the probe's; on a GPU
torch.cuda.max_memory_allocated, reset before each. The capacity: on a CPU MemAvailable (/proc/meminfo) + this process's RSS now; on a GPU the free
memory + what this process's allocator holds. The largest micro-batch that fits:

    largest = floor((HEADROOM x capacity - base) / per_sequence)        HEADROOM = 0.9

(a tenth kept for fragmentation and what the probe does not see). The generation's KV cache is not part of this
model: it is the sampler's (rollout.*), measured by the bench's end-to-end step.
"""

from __future__ import annotations

import copy
import math
import resource
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..errors import GrpolabError
from ..models import checkpoint as ckpt
from ..rollout.base import Rollout
from .metrics import peak_rss_mb

HEADROOM = 0.9
PROBE_SIZES = (1, 2, 4)  # warm-up, then the two sizes the line is fitted through


STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def memory_mib(device: torch.device) -> float:
    """Peak memory since the last ``reset_memory`` in MiB: torch.cuda.max_memory_allocated on a GPU; on a CPU the
    process's RSS high-water mark (VmHWM of /proc/self/status; ru_maxrss, the process's lifetime peak, where there
    is no /proc)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0  # kB
    except (OSError, ValueError):
        pass
    return peak_rss_mb()


def reset_memory(device: torch.device) -> None:
    """Start a phase's peak afresh: on a GPU torch.cuda.reset_peak_memory_stats; on a Linux CPU the RSS high-water
    mark set back to the current RSS (5 written to /proc/self/clear_refs, Linux >= 4.0), so a phase's peak does not
    carry an earlier phase's, or a long-lived process's, higher one."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        pass


def synthetic_rollout(rows: int, prompt_len: int, completion_len: int, vocab: int, device: torch.device) -> Rollout:
    """`rows` sequences of random tokens: `prompt_len` prompt tokens + `completion_len` completion tokens, every one
    trained on, none truncated (group index: one group per G consecutive rows is set by the caller's size)."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (rows, prompt_len), generator=g).to(device)
    completion = torch.randint(0, vocab, (rows, completion_len), generator=g).to(device)
    zeros = torch.zeros(rows, completion_len, device=device)
    return Rollout(
        prompt_ids=prompt,
        prompt_mask=torch.ones_like(prompt),
        completion_ids=completion,
        completion_mask=torch.ones_like(completion),
        sampler_logprobs=zeros,
        truncated=torch.zeros(rows, dtype=torch.bool, device=device),
        group=torch.arange(rows, device=device),
        texts=[""] * rows,
    )


def capacity_mib(device: torch.device) -> float:
    """Memory this process could use, in MiB: on a GPU free + reserved by this process; on a CPU MemAvailable + this
    process's resident set now (/proc)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return (free + torch.cuda.memory_reserved(device)) / 2**20
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            fields[key] = int(value.split()[0])  # kB
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return fields["MemAvailable"] / 1024 + resident_pages * resource.getpagesize() / 2**20


def largest_micro_batch(base_mib: float, per_sequence_mib: float, capacity: float, headroom: float = HEADROOM) -> int:
    """floor((headroom x capacity - base) / per_sequence), at least 0; a per-sequence cost the probe could not see
    (<= 0) puts no bound from memory: a very large number."""
    if per_sequence_mib <= 0:
        return 1 << 30
    return max(0, math.floor((headroom * capacity - base_mib) / per_sequence_mib))


def fit_line(peaks: dict[int, float]) -> tuple[float, float]:
    """(base, per_sequence) through the peaks at the two largest probe sizes."""
    lo, hi = sorted(peaks)[-2:]
    per = (peaks[hi] - peaks[lo]) / (hi - lo)
    return peaks[lo] - lo * per, per


def probe_peaks(trainer, sequence_length: tuple[int, int], sizes: tuple[int, ...] = PROBE_SIZES) -> dict[int, float]:
    """Peak memory in MiB after one update at each micro-batch of `sizes`, in order, on a synthetic batch
    (synthetic_rollout) of (prompt, completion) tokens a sequence and whole groups of the
    config's size, at least max(sizes) rows."""
    cfg, device, updater = trainer.cfg, trainer.device, trainer.updater
    g = cfg.rollout.group_size
    rows = g * math.ceil(max(sizes) / g)
    lp, lc = sequence_length
    rollout = synthetic_rollout(rows, lp, lc, trainer.policy.get_input_embeddings().weight.shape[0], device)
    rollout.group = torch.arange(rows, device=device) // g
    advantages = torch.tensor([1.0, -1.0], device=device).repeat(rows // 2 + 1)[:rows]
    valid = torch.ones(rows, dtype=torch.bool, device=device)
    ref = torch.zeros(rows, lc, device=device) if trainer.reference is not None else None
    peaks, kept = {}, updater.cfg
    try:
        for b in sizes:
            updater.cfg = replace(kept, train=replace(kept.train, micro_batch_size=b, mu=1, minibatches=1))
            reset_memory(device)
            updater.update(rollout, advantages, valid, ref_logp=ref, step=0)  # mu = 1: pi_old detached
            peaks[b] = memory_mib(device)
    finally:
        updater.cfg = kept
    return peaks


def memory_fit(trainer, sequence_length: tuple[int, int]) -> dict[str, Any]:
    """The probe, the line and the verdict for trainer.cfg's micro-batch (see the module docstring)."""
    t0 = time.perf_counter()
    peaks = probe_peaks(trainer, sequence_length)
    base, per = fit_line(peaks)
    capacity = capacity_mib(trainer.device)
    largest = largest_micro_batch(base, per, capacity)
    b = trainer.cfg.train.micro_batch_size
    return {
        "definition": "peak(b) = base + b x per_sequence, fitted through updates at micro-batches 2 and 4; "
        f"largest = floor(({HEADROOM} x capacity - base) / per_sequence)",
        "sequence_length": sum(sequence_length),
        "probe_peaks_mib": {str(k): v for k, v in peaks.items()},
        "base_mib": base,
        "per_sequence_mib": per,
        "capacity_mib": capacity,
        "headroom": HEADROOM,
        "micro_batch_size": b,
        "predicted_peak_mib": base + b * per,
        "largest_micro_batch": largest,
        "fits": b <= largest,
        "seconds": time.perf_counter() - t0,
    }


def refuse_if_too_big(fit: dict[str, Any]) -> None:
    """GrpolabError naming the largest micro-batch that fits when the config's would not."""
    if fit["fits"]:
        return
    b, largest = fit["micro_batch_size"], fit["largest_micro_batch"]
    advice = f"--set train.micro_batch_size={largest}" if largest else "a smaller model or rollout.max_new_tokens"
    raise GrpolabError(
        f"train.micro_batch_size = {b} would need about {fit['predicted_peak_mib']:,.0f} MiB at "
        f"{fit['sequence_length']} tokens a sequence ({fit['base_mib']:,.0f} MiB + {b} x "
        f"{fit['per_sequence_mib']:,.1f} MiB a sequence), over {HEADROOM:.0%} of the {fit['capacity_mib']:,.0f} MiB "
        f"this process can use; the largest micro-batch that fits is {largest}: {advice} (gradient accumulation "
        "keeps the update the same)"
    )


def probe_lengths(trainer) -> tuple[int, int]:
    """(prompt, completion) tokens of a probe sequence: the longest prompt of the first 64 training problems, and
    rollout.max_new_tokens (an agent episode: its max_total_tokens, every token after the prompt)."""
    problems = trainer.train_problems[:64]
    lp = max(len(trainer.collector.prompt_ids(p)) for p in problems)
    limits = [p.data["limits"]["max_total_tokens"] for p in problems if "limits" in (p.data or {})]
    return lp, max(limits) if limits else trainer.cfg.rollout.max_new_tokens


def not_probed(trainer) -> str | None:
    """Why the pre-run check does not apply to this trainer (None: it does)."""
    if trainer.cfg.train.memory_fit == "off":
        return "train.memory_fit: off"
    if trainer.world.size > 1:
        return "more than one process (the probe measures one process's update alone)"
    return None


def check_before_training(trainer) -> dict[str, Any]:
    """train.memory_fit = check: the probe on the run's own trainer before its first step, then everything the probe
    changed put back (weights, optimizer, scheduler, RNG states, skipped-step count, fp16 loss scale), so the run is the one it would
    have been without it, and a micro-batch that would not fit refused (GrpolabError naming the largest that does; the
    trainer closed first).

    The snapshot of the weights is held in the probed process: on a CPU its size is taken off the fitted base."""
    reason = not_probed(trainer)
    if reason is not None:
        return {"applies": False, "reason": reason}
    lp, lc = probe_lengths(trainer)
    trainer.tell(f"memory fit: probe updates at micro-batches 1, 2, 4 of {lp + lc} tokens")
    policy, optimizer, scheduler, updater = trainer.policy, trainer.optimizer, trainer.scheduler, trainer.updater
    weights = {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}
    held = sum(v.numel() * v.element_size() for v in weights.values()) / 2**20 if trainer.device.type == "cpu" else 0
    saved = (copy.deepcopy(optimizer.state_dict()), copy.deepcopy(scheduler.state_dict()), ckpt.rng_state())
    skipped, scaler = updater.skipped_steps, copy.deepcopy(updater.scaler)  # fp16: the loss scale too
    try:
        fit = memory_fit(trainer, (lp, lc))
    finally:
        policy.load_state_dict(weights)
        optimizer.load_state_dict(saved[0])
        scheduler.load_state_dict(saved[1])
        updater.skipped_steps, updater.scaler = skipped, scaler
        ckpt.set_rng_state(saved[2])
    fit["base_mib"] -= held
    fit["largest_micro_batch"] = largest_micro_batch(fit["base_mib"], fit["per_sequence_mib"], fit["capacity_mib"])
    fit["predicted_peak_mib"] = fit["base_mib"] + fit["micro_batch_size"] * fit["per_sequence_mib"]
    fit["fits"] = fit["micro_batch_size"] <= fit["largest_micro_batch"]
    try:
        refuse_if_too_big(fit)
    except GrpolabError:
        trainer.close()  # its process settings put back before the error goes up
        raise
    return {"applies": True, **fit}
