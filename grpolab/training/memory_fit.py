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

import math
import resource
import time
from dataclasses import replace
from typing import Any

import torch

from ..errors import GrpolabError

HEADROOM = 0.9
PROBE_SIZES = (1, 2, 4)  # warm-up, then the two sizes the line is fitted through


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
    (grpolab.training.bench.synthetic_rollout) of (prompt, completion) tokens a sequence and whole groups of the
    config's size, at least max(sizes) rows."""
    from .bench import memory_mib, reset_memory, synthetic_rollout

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
