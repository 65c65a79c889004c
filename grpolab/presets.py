"""Algorithm presets, each written as its differences from AlgorithmConfig's field defaults (grpolab/config.py).

Those defaults are the one definition of every algorithm field's default, and they are DeepSeekMath's GRPO, so the
``grpo`` preset changes nothing. config.from_dict expands a preset as defaults, then the preset's differences, then
every field the user set (YAML or --set); the resolved config and the manifest record every field explicitly.
Sources: DeepSeekMath (GRPO, Shao et al. 2024), DAPO (Yu et al. 2025), Dr. GRPO (Liu et al. 2025), RLOO (Ahmadian
et al. 2024), GSPO (Zheng et al. 2025).
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath GRPO = the defaults: group mean/std (torch's sample std), clip 0.2, k3 KL in the loss at beta 0.04,
    # per-sequence token mean.
    "grpo": {},
    # DAPO: clip-higher 0.2/0.28, token-level mean over the batch, no KL, dynamic sampling, soft overlong punishment.
    "dapo": {
        "eps_high": 0.28,
        "aggregation": "token_mean",
        "beta": 0.0,
        "dynamic_sampling": True,
        "max_extra_rounds": 3,
        "overlong_buffer": 16,
    },
    # Dr. GRPO: no std scaling, token sum normalised by a constant L_max, no KL.
    "dr_grpo": {"scaling": "none", "aggregation": "seq_mean_token_sum_norm", "beta": 0.0},
    # RLOO: leave-one-out baseline, no scaling, clipped ratio (as verl / TRL implement it), no KL.
    "rloo": {"baseline": "leave_one_out", "scaling": "none", "beta": 0.0},
    # GSPO: sequence-level length-normalised ratio with tight clip ranges, no KL.
    "gspo": {"surrogate": "gspo", "eps_low": 3e-4, "eps_high": 4e-4, "beta": 0.0},
}
