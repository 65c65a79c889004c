"""Bitwise reproducibility (``train.deterministic``, docs/robustness.md): the same config and seed on the same
machine, thread count and versions give the same samples, metrics and weights, in fp32 and bf16, in one
process and under torchrun.

What it takes, beyond seeding every RNG (grpolab.models.checkpoint.seed_everything) and each group's own sampling stream:

- ``torch.use_deterministic_algorithms(True, warn_only=True)``: torch's deterministic kernel wherever it has one;
  an op without one warns instead of stopping the run. Its companion
  ``torch.utils.deterministic.fill_uninitialized_memory`` (on by default: every ``torch.empty`` is filled with NaN)
  is switched off: it only makes a kernel that reads memory it never wrote repeatable, at the price of one more
  write of every new buffer (11,617 fills in one bf16 quickstart update on Intel AMX); the rerun tests
  (tests/test_reproducibility.py) show the same bytes without it.
- **Attention in the training passes without CPU flash attention.** PyTorch's CPU flash-attention backward
  (chosen by default for a masked float32 SDPA, e.g. packing's block-causal mask, and inside bf16's
  ``sdpa_fp32``) returned different key gradients for the same inputs in one process (measured on the quickstart:
  gradient norm 1.930695 vs 1.930619 on two identical updates; one layer's k_proj of 30). The training passes
  compute attention with ``grouped_attention`` (grpolab/training/attention.py: matrix products and a softmax, the
  key/value heads not repeated), and SDPA's math backend where that does not apply; both give the same bytes
  every time. Against the flash backward: 1.02x the bf16 update, 1.00x the fp32 one (SDPA's math backend: 1.07x,
  1.02x; benchmarks/levers.py --only-deterministic, docs/performance.md); memory grows with the square of the
  packed length. Decoding and no-grad passes keep the default backend: their forward is deterministic.
- Reductions grpolab owns (group statistics, metrics, the KL penalty) run in a fixed order in float64.

torch's two settings are process-wide: a Trainer sets them for its run (off for a non-deterministic one) and puts
back what it found when the run ends (grpolab.training.process_settings).

What it does not cover, and the manifest says so (``reproducibility``): another thread count, CPU kind or library
version (other kernels, other rounding); CUDA kernels without a deterministic version (torch warns: the run is
then recorded as not verified).
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
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            bool(torch.utils.deterministic.fill_uninitialized_memory))


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
        return {"bitwise": False, "why": "train.deterministic is false (CPU flash-attention backward and any "
                                         "kernel torch has no deterministic version of may differ between runs)"}
    where = ("CPU: deterministic algorithms on, training attention through grouped_attention or SDPA's math backend" if device.type == "cpu"
             else f"{device.type}: deterministic algorithms on (warn only); not verified on this device type")
    return {"bitwise": device.type == "cpu", "threads": torch.get_num_threads(), "how": where,
            "holds_for": "the same config, seed, machine (not only its CPU kind), thread count and package versions"}
