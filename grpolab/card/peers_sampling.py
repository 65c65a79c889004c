"""The peers' equivalents of the sampling-side axes (importance sampling, off-policy masking, entropy, truncation,
overlong shaping, dynamic sampling, batch shape), in card/peers.py's row format."""

from __future__ import annotations

from ..config import Config
from .peers import EXACT, NEAREST, NONE, _row, _unless

VERL_NO_LOWER = 1e-30  # a lower mask bound for verl that no weight reaches: exp(-20) ~ 2e-9 is its least
GSPO_TOKEN_IS = (
    "with importance_sampling_level=sequence, each token's gradient weighted by its sequence's mean IS weight, "
    "not its own"
)


def _importance(cfg: Config) -> dict[str, dict]:
    """The IS weighting's rows, with the geometric rejection folded in (verl: rollout_rs; the others: none)."""
    rows = _is_weighting(cfg)
    a = cfg.algorithm
    if a.pi_old == "sampler":  # pi_old is q: no weight (config/checks.py refuses is_mode and is_reject with it)
        recomputed = "pi_old is always the trainer's policy, recomputed (no bypass of the old-logprob pass)"
        return {
            "trl": _row(NONE, {}, recomputed),
            "verl": _row(
                NEAREST,
                {"algorithm.rollout_correction.bypass_mode": True, "algorithm.rollout_correction.rollout_is": None},
                "bypass mode takes the rollout's log-probabilities as pi_old (not compared with verl's code here)",
            ),
            "openrlhf": _row(NONE, {}, recomputed),
        }
    if a.is_reject == "none":
        return rows
    verl = rows["verl"]
    settings = {
        **verl["settings"],
        "algorithm.rollout_correction.rollout_rs": "seq_mean_k1",
        # verl's statistic is mean_t log(q / pi_old) = -log g_i: the bounds are inverted
        "algorithm.rollout_correction.rollout_rs_threshold": f"{1 / a.is_reject_hi!r}_{1 / a.is_reject_lo!r}",
    }
    diff = (
        "rejected sequences leave the response mask before the advantage step (A = 0) and the aggregation's "
        "denominators (grpolab: weight 0)"
    )
    extra = [verl["difference"]] if "difference" in verl else []
    return {
        "trl": _row(NONE, {}, "no sequence rejection (vllm_importance_sampling_mode weights or masks only)"),
        "verl": _row(NEAREST if verl["match"] != NONE else NONE, settings, "; ".join(extra + [diff])),
        "openrlhf": _row(NONE, {}, "no rejection separate from its IS weight"),
    }


def _is_weighting(cfg: Config) -> dict[str, dict]:
    a = cfg.algorithm
    mode, loo = a.is_mode.value, a.baseline == "leave_one_out"
    if mode == "none":
        trl = _row(EXACT, {} if loo else {"vllm_importance_sampling_correction": False})
        return {
            "trl": trl,
            "verl": _row(EXACT, {"algorithm.rollout_correction.rollout_is": None}),
            "openrlhf": _row(EXACT),
        }
    truncate, token = mode.endswith("_truncate"), mode.startswith("token")
    # GSPO: TRL's token weights multiply the sequence ratio's term (same value), grpolab's the token form's own term
    gspo_token = a.surrogate == "gspo" and token
    trl = (
        _row(NONE, {}, "RLOOTrainer has no sampler-mismatch correction")
        if loo
        else _unless(
            [GSPO_TOKEN_IS] if gspo_token else [],
            {
                "use_vllm": True,
                "vllm_importance_sampling_correction": True,
                "vllm_importance_sampling_mode": mode,
                "vllm_importance_sampling_clip_max": a.is_c_max,
                "vllm_importance_sampling_clip_min": a.is_c_min if mode == "token_mask" else None,
            },
        )
    )
    # verl: C = truncate, "low_high" = mask; its mask needs a lower bound > 0, and VERL_NO_LOWER is below every weight
    # verl can produce (its log-ratios are clamped at -20), so sequence_mask masks above C only there too
    lower = a.is_c_min if mode == "token_mask" else VERL_NO_LOWER
    threshold = a.is_c_max if truncate else f"{lower!r}_{a.is_c_max!r}"
    verl_differences = (
        [
            "geo_mean weights each sequence loss by the geometric mean of its tokens' IS weights; grpolab weights each "
            "token's gradient by its own weight"
        ]
        if a.surrogate == "gmpo"
        else []
    )
    verl = _unless(
        verl_differences,
        {
            "algorithm.rollout_correction.rollout_is": "token" if token else "sequence",
            "algorithm.rollout_correction.rollout_is_threshold": threshold,
        },
    )
    flag = "--algo.advantage.is_correction_"
    if a.surrogate == "gspo":
        orl = _row(
            NONE, {}, "with GSPO, OpenRLHF folds the correction into the sequence ratio (log pi - log pi_sampler)"
        )
    elif mode == "sequence_truncate":
        orl = _row(NONE, {}, "OpenRLHF clips per token only")
    else:
        settings = {
            f"{flag}level": "token" if token else "seq",
            f"{flag}mode": "clip" if truncate else "mask",
            f"{flag}threshold": [a.is_c_min if mode == "token_mask" else 0.0, a.is_c_max],
        }
        orl = _unless(
            [] if token else ["gates on the geometric mean exp(mean_t log w); kept tokens keep their token weights"],
            settings,
        )
    return {"trl": trl, "verl": verl, "openrlhf": orl}


def _entropy(cfg: Config) -> dict[str, dict]:
    a = cfg.algorithm
    c, loo = a.entropy_coef, a.baseline == "leave_one_out"
    verl = _row(EXACT, {"actor_rollout_ref.actor.entropy_coeff": c})
    if not c:
        return {"trl": _row(EXACT, {} if loo else {"entropy_coef": 0.0}), "verl": verl, "openrlhf": _row(EXACT)}
    trl = (
        _row(NONE, {}, "RLOOTrainer has no entropy bonus")
        if loo
        else _row(NEAREST, {"entropy_coef": c}, "the bonus is the token mean of each micro-batch, whatever loss_type")
    )
    orl = _unless(
        [] if a.aggregation == "token_mean" else ["the entropy term is token-mean whatever --actor.loss_agg_mode"],
        {"--actor.entropy_coef": c},
    )
    return {"trl": trl, "verl": verl, "openrlhf": orl}


def _offpolicy_mask(cfg: Config) -> dict[str, dict]:
    a = cfg.algorithm
    if a.offpolicy_mask_delta <= 0:
        trl = _row(EXACT, {} if a.baseline == "leave_one_out" else {"off_policy_mask_threshold": None})
        return {"trl": trl, "verl": _row(EXACT), "openrlhf": _row(EXACT)}
    if a.baseline == "leave_one_out":
        trl = _row(NONE, {}, "RLOOTrainer has no off-policy sequence mask")
    else:
        trl = _unless(
            [] if a.is_mode != "none" else ["without vLLM it measures the drift from pi_old, not from the sampler"],
            {"off_policy_mask_threshold": a.offpolicy_mask_delta},
        )
    return {
        "trl": trl,
        "verl": _row(NONE, {}, "no off-policy sequence mask"),
        "openrlhf": _row(NONE, {}, "no off-policy sequence mask"),
    }


def _mask_truncated(cfg: Config) -> dict[str, dict]:
    if not cfg.algorithm.mask_truncated:
        return {"trl": _row(EXACT, {"mask_truncated_completions": False}), "verl": _row(EXACT), "openrlhf": _row(EXACT)}
    return {
        "trl": _row(EXACT, {"mask_truncated_completions": True}),
        "verl": _row(NONE, {}, "no option drops truncated completions from the loss"),
        "openrlhf": _row(NONE, {}, "--reward.stop_properly_penalty_coef 0 zeroes their reward instead"),
    }


def _overlong(cfg: Config) -> dict[str, dict]:
    a, max_len = cfg.algorithm, cfg.rollout.max_new_tokens
    if a.overlong_buffer <= 0:
        return {"trl": _row(EXACT), "verl": _row(EXACT), "openrlhf": _row(EXACT)}
    trl = _row(
        EXACT,
        {},
        reward_function=f"trl.rewards.get_soft_overlong_punishment(max_completion_len={max_len}, "
        f"soft_punish_cache={a.overlong_buffer}) with reward weight {a.overlong_penalty}",
    )
    buffer = "+reward.reward_kwargs.overlong_buffer_cfg."
    verl = _row(
        EXACT,
        {
            "reward.reward_manager.name": "dapo",
            f"{buffer}enable": True,
            f"{buffer}len": a.overlong_buffer,
            f"{buffer}penalty_factor": a.overlong_penalty,
            f"{buffer}log": False,
            "+reward.reward_kwargs.max_resp_len": max_len,
        },
    )
    orl = _row(
        EXACT,
        {"--reward.overlong_buffer_len": a.overlong_buffer, "--reward.overlong_penalty_factor": a.overlong_penalty},
    )
    return {"trl": trl, "verl": verl, "openrlhf": orl}


def _dynamic_sampling(cfg: Config) -> dict[str, dict]:
    if not cfg.algorithm.dynamic_sampling:
        return {
            "trl": _row(EXACT),
            "verl": _row(EXACT, {"algorithm.filter_groups.enable": False}),
            "openrlhf": _row(EXACT),
        }
    return {
        "trl": _row(NONE, {}, "zero-signal groups stay in the batch with A = 0"),
        "verl": _row(
            NEAREST,
            {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "reward"},
            "refills with no round limit (0.9's replay buffer ignores max_num_gen_batches)",
        ),
        "openrlhf": _row(
            NEAREST,
            {"--algo.dynamic_filtering_enable": True},
            "keeps a group when its mean reward is strictly inside --algo.dynamic_filtering_range (0 1), "
            "with no round limit",
        ),
    }


def _batch(cfg: Config) -> dict[str, dict]:
    t, g, max_len = cfg.train, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    rollouts = t.prompts_per_step * g
    trl = _row(
        EXACT,
        {
            "num_generations": g,
            "num_iterations": t.mu,
            "max_completion_length": max_len,
            "generation_batch_size": rollouts,
            "per_device_train_batch_size": rollouts // t.minibatches,
            "gradient_accumulation_steps": 1,
        },
        note="one process; with N processes divide per_device_train_batch_size by N",
    )
    verl = _row(
        EXACT,
        {
            "data.train_batch_size": t.prompts_per_step,
            "data.max_response_length": max_len,
            "actor_rollout_ref.actor.ppo_mini_batch_size": t.prompts_per_step // t.minibatches,
            "actor_rollout_ref.actor.ppo_epochs": t.mu,
            "actor_rollout_ref.rollout.n": g,
        },
    )
    orl = _row(
        EXACT,
        {
            "--rollout.batch_size": t.prompts_per_step,
            "--rollout.n_samples_per_prompt": g,
            "--rollout.max_new_tokens": max_len,
            "--train.batch_size": rollouts // t.minibatches,
            "--train.max_epochs": t.mu,
        },
    )
    return {"trl": trl, "verl": verl, "openrlhf": orl}
