"""The periodic reference reset (ProRL, Liu et al. 2025, arXiv 2505.24864; algorithm.ref_reset_every = N > 0): after the
update of every N-th step, pi_ref <- pi_theta, so the KL term measures the drift from there instead of from the
base model, and the AdamW moments are cleared at the same time (the LR schedule is not touched), as ProRL does (it
hard-resets the reference to the online policy and reinitialises the optimizer states). algorithm.ref_reset_optimizer:
null (the default) clears them whenever a reset is configured, false keeps them (grpolab's behaviour before issue 59);
``clears_optimizer`` resolves it.

A reset reference is no longer the base model, so it cannot be rebuilt from model.name on a resume: once a run has
reset it, every checkpoint's trainer state carries the reference's weights (``reference_state``), and a resume
restores them bit for bit (``restore_reference``). Rebuilding it from the checkpoint of the last reset step would
save that copy, but that checkpoint need not exist (train.save_every need not divide N) or survive (train.keep_last
prunes it); the copy in the state costs one reference (in its own dtype) per checkpoint, and only after a reset.

Under LoRA the reference is the policy with its adapters off (grpolab.models.lora.AdapterOff): the first reset
replaces it by a frozen merged copy (base + adapters; grpolab.models.load.frozen_copy), one model's memory more.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import Config
from ..config.schema import AlgorithmConfig
from ..errors import ConfigError
from ..models.load import copy_weights_by_name, frozen_copy
from ..models.lora import AdapterOff

METRICS = ("reference/resets", "reference/last_reset_step")  # logged on every step of a run with resets configured


def check_reset_config(cfg: Config) -> None:
    """A reset needs a reference (beta > 0), and the optimizer reset needs a reset."""
    a = cfg.algorithm
    if a.ref_reset_every > 0 and a.beta <= 0:
        raise ConfigError(
            f"algorithm.ref_reset_every: expected 0 when algorithm.beta is 0 (there is no reference model to reset), "
            f"got {a.ref_reset_every}"
        )
    if a.ref_reset_optimizer and a.ref_reset_every == 0:
        raise ConfigError(
            "algorithm.ref_reset_optimizer: expected false or null when algorithm.ref_reset_every is 0 (the optimizer "
            "is cleared at a reference reset, and none is configured)"
        )


def clears_optimizer(a: AlgorithmConfig) -> bool:
    """Whether a reference reset also clears the optimizer: algorithm.ref_reset_optimizer when set, else (null) as
    ProRL, whenever a reset is configured (ref_reset_every > 0).

    >>> from dataclasses import replace
    >>> a = AlgorithmConfig(ref_reset_every=5)
    >>> clears_optimizer(a), clears_optimizer(replace(a, ref_reset_optimizer=False)), clears_optimizer(AlgorithmConfig())
    (True, False, False)
    """
    return a.ref_reset_every > 0 if a.ref_reset_optimizer is None else a.ref_reset_optimizer


def reset_due(step: int, every: int) -> bool:
    """Whether the reference is reset after the update of `step` (1-based: the step just completed).

    >>> [s for s in range(1, 8) if reset_due(s, 3)], reset_due(4, 0)
    ([3, 6], False)
    """
    return every > 0 and step > 0 and step % every == 0


@torch.no_grad()
def reset_reference(reference, policy, dtype: torch.dtype):
    """pi_ref <- the current policy; returns the reference to use from now on (the same object, or under LoRA a new
    frozen merged copy in `dtype` in place of the adapters-off view). An FSDP2-sharded policy is gathered."""
    if isinstance(reference, AdapterOff):
        return frozen_copy(policy, dtype)
    copy_weights_by_name(reference, policy)
    return reference


def clear_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Forget AdamW's moments and step counts: the next step starts them again from zero (as a new optimizer would),
    with the same parameter groups and learning rates."""
    optimizer.state.clear()


def reference_state(reference) -> dict[str, torch.Tensor]:
    """The reference's parameters by name (tied parameters once), for a checkpoint's trainer state."""
    return {name: p.detach() for name, p in reference.named_parameters()}


@torch.no_grad()
def restore_reference(reference, policy, dtype: torch.dtype, weights: dict[str, Any]):
    """The reference of a checkpoint: `weights` (reference_state) copied by name into the reference (under LoRA into
    a new frozen copy first); returns the reference to use. A different set of names is a ValueError naming one."""
    if isinstance(reference, AdapterOff):
        reference = frozen_copy(policy, dtype)
    own = dict(reference.named_parameters())
    if own.keys() != weights.keys():
        first = sorted(own.keys() ^ weights.keys())[0]
        raise ValueError(f"the checkpoint's reference weights do not fit this model (first mismatch: {first!r})")
    for name, p in own.items():
        p.copy_(weights[name])
    return reference
