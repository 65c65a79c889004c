"""Bitwise reproducibility (``train.deterministic``): the same config and seed on the same machine, thread count and
versions give the same samples, metrics and weights, in fp32 and bf16, in one process and under torchrun.

Beyond seeding every RNG (grpolab.models.checkpoint.seed_everything) and each group's own sampling stream, it takes:

- ``torch.use_deterministic_algorithms(True, warn_only=True)``, with its NaN fill of every new buffer
  (``torch.utils.deterministic.fill_uninitialized_memory``) off: the fill only makes a kernel that reads memory it
  never wrote repeatable, costs one write of every buffer, and the rerun tests show the same bytes without it.
- Training passes on a CPU without the flash-attention backward, whose key gradients differ between two identical
  updates: ``grouped_attention`` (grpolab/training/attention.py) where it applies, SDPA's math backend elsewhere;
  both repeat. Decoding and no-grad passes keep the default backend (their forward repeats).
- Reductions grpolab owns (group statistics, metrics, the KL penalty) in a fixed order in float64.

torch's settings are process-wide: a Trainer sets them for its run and puts back what it found when the run ends
(grpolab.training.process_settings). Not covered (the manifest's ``reproducibility`` says so): another thread count,
CPU kind or library version; CUDA kernels without a deterministic version. The bug, the cost and the tests:
docs/robustness.md, "Determinism"; docs/performance.md, "Levers" (grouped heads) and "Deterministic mode's fill of
new memory".
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .attention import grouped_passes

DeterministicState = tuple[bool, bool, bool]  # (deterministic algorithms, warn only, fill_uninitialized_memory)


def deterministic_state() -> DeterministicState:
    """torch's process-wide deterministic settings as they are now."""
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        bool(torch.utils.deterministic.fill_uninitialized_memory),
    )


def set_deterministic_state(state: DeterministicState) -> None:
    """Put torch's deterministic settings to ``state`` (a `deterministic_state`)."""
    enabled, warn_only, fill = state
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def enable(deterministic: bool) -> DeterministicState:
    """Switch torch's deterministic algorithms on (warn only, without the NaN fill: see the module text) for a
    deterministic run; leave them as they are else. Returns the state before, for `set_deterministic_state`: the
    settings are process-wide, and a run puts them back when it ends (grpolab.training.process_settings)."""
    before = deterministic_state()
    if deterministic:
        set_deterministic_state((True, True, False))
    return before


@contextlib.contextmanager
def training_attention(deterministic: bool, device: torch.device) -> Iterator[None]:
    """Around a training pass on a CPU in a deterministic run: grouped_attention, else SDPA's math backend (see the module text)."""
    if deterministic and device.type == "cpu":
        with sdpa_kernel(SDPBackend.MATH), grouped_passes():
            yield
    else:
        yield


def record(deterministic: bool, device: torch.device) -> dict[str, Any]:
    """The manifest's ``reproducibility`` entry: whether a rerun is expected to give the same bytes, and under what."""
    if not deterministic:
        return {
            "bitwise": False,
            "why": "train.deterministic is false (CPU flash-attention backward and any "
            "kernel torch has no deterministic version of may differ between runs)",
        }
    where = (
        "CPU: deterministic algorithms on, training attention through grouped_attention or SDPA's math backend"
        if device.type == "cpu"
        else f"{device.type}: deterministic algorithms on (warn only); not verified on this device type"
    )
    return {
        "bitwise": device.type == "cpu",
        "threads": torch.get_num_threads(),
        "how": where,
        "holds_for": "the same config, seed, machine (not only its CPU kind), thread count and package versions",
    }
