"""Algorithm presets, each written as its differences from AlgorithmConfig's field defaults (grpolab/config/schema.py).

Those defaults are the one definition of every algorithm field's default, and they are DeepSeekMath's GRPO, so the
``grpo`` preset changes nothing. config.from_dict expands a preset as defaults, then the preset's differences, then
every field the user set (YAML or --set); the resolved config and the manifest record every field explicitly.
Sources: DeepSeekMath (GRPO, Shao et al. 2024), DAPO (Yu et al. 2025), Dr. GRPO (Liu et al. 2025), RLOO (Ahmadian
et al. 2024), GSPO (Zheng et al. 2025), CISPO (MiniMax-M1, arXiv 2506.13585), GMPO (arXiv 2507.20673), SAPO (Qwen,
arXiv 2511.20347), IcePop (Ring-1T), ScaleRL (Khatri et al. 2025, arXiv 2510.13786), DPPO (Qi et al. 2026, arXiv
2602.04879), LUSPO (arXiv 2602.05261).
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
    # CISPO (MiniMax-M1): the clipped, detached IS weight on a REINFORCE term (no lower bound, upper 1 + 4), token-level
    # mean over the batch, no KL.
    "cispo": {"surrogate": "cispo", "aggregation": "token_mean", "beta": 0.0},
    # GMPO: geometric mean of the token ratios, clipped in log space to [-0.4, 0.4], no KL.
    "gmpo": {"surrogate": "gmpo", "eps_low": 0.4, "eps_high": 0.4, "beta": 0.0},
    # SAPO: soft gate with temperatures 1.0 (A > 0) / 1.05 (A <= 0), per-sequence token mean, no KL.
    "sapo": {"surrogate": "sapo", "beta": 0.0},
    # IcePop: GRPO with the sampler-mismatch weight masked outside [0.5, 5] -- exactly is_mode token_mask with those
    # bounds (is_c_min 0.5 is the default; set the three fields on any other preset to combine it).
    "icepop": {"is_mode": "token_mask", "is_c_max": 5.0},
    # ScaleRL as far as grpolab goes: CISPO, prompt-level loss average, group mean with batch-level std, zero-variance
    # groups filtered out without refilling (max_extra_rounds stays at its default 0), no KL. Not reproduced: PipelineRL's asynchronous
    # in-flight weight updates, the FP32 LM head, no-positive-resampling and length interruptions (docs/algorithms.md).
    # DPPO (Binary-TV / Binary-KL): the ratio clip replaced by a trust region on the sampled token's probability, with
    # the paper's and verl's example recipe around it: Dr. GRPO's advantage (no std) and token sum over a constant, no
    # KL; TV bounds 0.15 (the defaults), binary-KL bounds 0.05.
    # Both anchor the trust region on the sampler's q, as the paper and prime-rl do (pi_old: sampler).
    "dppo_tv": {
        "surrogate": "dppo_tv",
        "scaling": "none",
        "aggregation": "seq_mean_token_sum_norm",
        "beta": 0.0,
        "pi_old": "sampler",
    },
    "dppo_kl": {
        "pi_old": "sampler",
        "surrogate": "dppo_kl",
        "dppo_low": 0.05,
        "dppo_high": 0.05,
        "scaling": "none",
        "aggregation": "seq_mean_token_sum_norm",
        "beta": 0.0,
    },
    # LUSPO: GSPO whose sequence loss is multiplied by the sequence's length -- GSPO's token form summed over the
    # sequence's tokens (seq_mean_token_sum), GSPO's clip ranges, no KL (TRL loss_type luspo).
    "luspo": {"surrogate": "gspo", "eps_low": 3e-4, "eps_high": 4e-4, "aggregation": "seq_mean_token_sum", "beta": 0.0},
    "scalerl": {
        "surrogate": "cispo",
        "aggregation": "prompt_mean_token_mean",
        "scaling": "batch_std",
        "dynamic_sampling": True,
        "beta": 0.0,
    },
}
