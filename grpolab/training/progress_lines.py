"""One-line progress of a training step, shared by `grpolab train` (grpolab/cli/train.py) and the Python API's
default output (grpolab/api.py): plain text, no markup, pure formatting of the step's metrics (docs/design.md
section 5 names)."""

from __future__ import annotations

# (metric, label, format) shown after the reward when the step logged it; policy/kl only when algorithm.beta > 0
STEP_FIELDS = (
    ("loss/total", "loss", "{:+.4f}"),
    ("policy/kl", "kl", "{:.4f}"),
    ("policy/entropy", "entropy", "{:.3f}"),
)


def step_line(step: int, total: int, m: dict[str, float], held_out: float | None, show_kl: bool = False) -> str:
    """The progress of one step as one line: reward, loss (loss/total), KL to the reference (policy/kl, when
    `show_kl`: algorithm.beta > 0), entropy (policy/entropy), held-out accuracy when measured, step time. A metric
    the step did not log is left out.

    >>> step_line(3, 30, {"reward/mean": 0.5, "loss/total": -0.0123, "policy/kl": 0.002, "policy/entropy": 0.81,
    ...                   "time/step_s": 9.25}, 0.625, show_kl=True)
    'step 3/30  reward 0.500  loss -0.0123  kl 0.0020  entropy 0.810  held-out 0.625  9.2s/step'
    """
    text = f"step {step}/{total}  reward {m['reward/mean']:.3f}"
    for key, label, form in STEP_FIELDS:
        if key in m and (show_kl or key != "policy/kl"):
            text += f"  {label} {form.format(m[key])}"
    if held_out is not None:
        text += f"  held-out {held_out:.3f}"
    return text + f"  {m['time/step_s']:.1f}s/step"


def trainer_step_line(trainer, step: int, m: dict[str, float]) -> str:
    """step_line of a Trainer's step: its configured steps, its last held-out accuracy, KL shown when beta > 0."""
    cfg = trainer.cfg
    return step_line(
        step,
        cfg.train.steps,
        m,
        trainer.last_eval.accuracy if trainer.last_eval else None,
        show_kl=cfg.algorithm.beta > 0,
    )
