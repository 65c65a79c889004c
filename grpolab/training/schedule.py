"""The learning-rate schedule of a run (train.warmup_steps, train.schedule, train.min_lr_ratio), by optimizer step of
the plan: train.steps x train.mu x train.minibatches optimizer steps."""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..config import Config


def lr_lambda(cfg: Config) -> Callable[[int], float]:
    """LR factor of optimizer step i of the plan (train.steps * mu * minibatches steps): linear warmup over
    warmup_steps, then constant or cosine down to min_lr_ratio."""
    t = cfg.train
    total = t.steps * t.mu * t.minibatches

    def f(i: int) -> float:
        if i < t.warmup_steps:
            return (i + 1) / t.warmup_steps
        if t.schedule == "constant":
            return 1.0
        progress = min(1.0, (i - t.warmup_steps) / max(1, total - t.warmup_steps))
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def align_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, planned_steps: int) -> None:
    """Put the LR schedule where the plan says it is after `planned_steps` optimizer steps, whatever the update
    actually took (fewer when dynamic sampling kept fewer groups than minibatches, or a non-finite step was
    skipped), so the LR of training step s never depends on earlier steps' batch sizes."""
    if scheduler.last_epoch != planned_steps:
        scheduler.last_epoch = planned_steps - 1
        scheduler.step()
