"""Algorithm presets: each expands into explicit field values of AlgorithmConfig (recorded expanded).

Any field set by the user overrides the preset's value. Sources: DeepSeekMath (GRPO, Shao et al. 2024),
DAPO (Yu et al. 2025), Dr. GRPO (Liu et al. 2025), RLOO (Ahmadian et al. 2024), GSPO (Zheng et al. 2025).
"""

from __future__ import annotations

from typing import Any

_COMMON: dict[str, Any] = {
    "baseline": "group_mean",
    "scaling": "group_std",
    "std_kind": "sample",
    "adv_eps": 1e-6,
    "surrogate": "ppo_clip",
    "eps_low": 0.2,
    "eps_high": 0.2,
    "dual_clip_c": 3.0,
    "aggregation": "seq_mean_token_mean",
    "beta": 0.0,
    "kl_estimator": "k3",
    "kl_placement": "loss",
    "is_mode": "none",
    "is_c_max": 2.0,
    "is_c_min": 0.5,
    "entropy_coef": 0.0,
    "mask_truncated": False,
    "overlong_buffer": 0,
    "overlong_penalty": 1.0,
    "dynamic_sampling": False,
    "max_extra_rounds": 0,
    "estimator": "group",  # group-relative advantages; gae = PPO with a critic (grpolab/baselines/ppo.py), no preset of its own
    "gamma": 1.0,
    "lam": 0.95,
    "whiten": True,
}

PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath GRPO: group mean/std (torch's sample std), clip 0.2, k3 KL in the loss, per-sequence token mean.
    "grpo": {**_COMMON, "beta": 0.04},
    # DAPO: clip-higher 0.2/0.28, token-level mean over the batch, no KL, dynamic sampling, soft overlong punishment.
    "dapo": {
        **_COMMON,
        "eps_high": 0.28,
        "aggregation": "token_mean",
        "dynamic_sampling": True,
        "max_extra_rounds": 3,
        "overlong_buffer": 16,
    },
    # Dr. GRPO: no std scaling, token sum normalised by a constant L_max, no KL.
    "dr_grpo": {**_COMMON, "scaling": "none", "aggregation": "seq_mean_token_sum_norm"},
    # RLOO: leave-one-out baseline, no scaling, clipped ratio (as verl / TRL implement it), no KL.
    "rloo": {**_COMMON, "baseline": "leave_one_out", "scaling": "none"},
    # GSPO: sequence-level length-normalised ratio with tight clip ranges, no KL.
    "gspo": {**_COMMON, "surrogate": "gspo", "eps_low": 3e-4, "eps_high": 4e-4},
}
