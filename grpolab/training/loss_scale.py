"""Dynamic loss scaling of the fp16 update (``train.precision: fp16``): fp16 autocast over fp32 master weights.

fp16 keeps 10 mantissa bits like bf16 has 7, but only 5 exponent bits: values below 2^-24 flush to zero and above
65504 overflow to inf. Gradients of a token-mean loss sit near the bottom of that range, so the loss is multiplied by
a scale S before the backward (every gradient in the graph is S times the true one, lifted out of the underflow
zone) and the accumulated fp32 gradients are divided by S before clipping (clipping and the optimizer see the true
gradient; the norm is the one of the unscaled gradient). S follows torch.amp.GradScaler's rule (``next_scale``):
halved, and the optimizer step skipped, when the unscaled gradient holds an inf or NaN; doubled after
``growth_interval`` good steps in a row.

A skip for overflow is the scale searching its range, not a fault: it is counted in ``optim/overflow_skipped_steps``
and not in ``optim/skipped_steps`` (whose streak stops a run after train.max_nonfinite_steps). Only at
``MIN_SCALE`` (no range left to search) does an overflow count as a non-finite step. A non-finite *loss* is never
an overflow (the loss is computed before scaling) and is handled as in fp32 and bf16. The scaler's state is in every
checkpoint (trainer state ``faults.loss_scaler``), so a resume continues with the same scale.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

GROWTH = 2.0  # torch.amp.GradScaler's growth_factor
BACKOFF = 0.5  # and its backoff_factor
MIN_SCALE = 1.0
"""At or below this scale an overflow is a non-finite gradient (counted in optim/skipped_steps): a scale < 1 only
helps a gradient whose true value exceeds fp16's 65504, which is a diverging run, not a range problem."""


def next_scale(
    scale: float,
    good_steps: int,
    overflow: bool,
    growth_interval: int,
    growth: float = GROWTH,
    backoff: float = BACKOFF,
) -> tuple[float, int]:
    """(scale, good_steps) after one optimizer step, torch.amp.GradScaler's update rule:

        overflow:                            S' = S * backoff, n' = 0
        no overflow, n + 1 == growth_interval:  S' = S * growth,  n' = 0
        no overflow otherwise:               S' = S,           n' = n + 1

    >>> next_scale(65536.0, 5, True, 3), next_scale(8.0, 1, False, 3), next_scale(8.0, 2, False, 3)
    ((32768.0, 0), (8.0, 2), (16.0, 0))
    """
    if overflow:
        return scale * backoff, 0
    if good_steps + 1 >= growth_interval:
        return scale * growth, 0
    return scale, good_steps + 1


class LossScaler:
    """The fp16 update's loss scale S (module docstring): ``scaled(loss)`` before the backward, ``unscale_`` before
    clipping, then ``stepped()`` after an optimizer step or ``overflowed()`` after a skipped one."""

    def __init__(self, init_scale: float, growth_interval: int):
        self.scale, self.growth_interval = float(init_scale), int(growth_interval)
        self.good_steps = 0  # optimizer steps without overflow since the scale last changed
        self.overflow_steps = 0  # optimizer steps skipped for an overflow, over the whole run

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """S * loss (what the backward runs on)."""
        return loss * self.scale

    def unscale_(self, params: Iterable[torch.Tensor]) -> None:
        """Divide every accumulated gradient by S in place (g = g_scaled / S), before clipping."""
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_div_(grads, self.scale)

    def stepped(self) -> None:
        """An optimizer step was taken: count it towards growth (``next_scale``)."""
        self.scale, self.good_steps = next_scale(self.scale, self.good_steps, False, self.growth_interval)

    def overflowed(self) -> bool:
        """The unscaled gradient was not finite and the step is skipped: halve S (``next_scale``). True when this
        counts as an overflow; False at S <= MIN_SCALE, where it is a non-finite gradient (S unchanged)."""
        if self.scale <= MIN_SCALE:
            return False
        self.scale, self.good_steps = next_scale(self.scale, self.good_steps, True, self.growth_interval)
        self.overflow_steps += 1
        return True

    def metrics(self) -> dict[str, float]:
        """optim/loss_scale (S after this step's updates) and optim/overflow_skipped_steps (over the run)."""
        return {"optim/loss_scale": self.scale, "optim/overflow_skipped_steps": float(self.overflow_steps)}

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps, "overflow_steps": self.overflow_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
        self.overflow_steps = int(state["overflow_steps"])


def make_scaler(precision: str, init_scale: float, growth_interval: int) -> LossScaler | None:
    """A LossScaler for the fp16 update, None for fp32 and bf16 (bf16 has fp32's exponent range: nothing to scale)."""
    return LossScaler(init_scale, growth_interval) if precision == "fp16" else None
