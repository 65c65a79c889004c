"""The objective card as the manifest stores it: the formula, every choice, and each peer's equivalents (one row per
axis, AXES)."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from ..algo.surrogate import PolicyLossParams
from ..baselines import ppo_card
from ..config import Config
from ..rewards import stop_rule
from ..rewards.judge import judge_card
from ..rewards.model import reward_model_card
from ..training.precision import card_entry, unresolved
from ..training.reference import clears_optimizer
from .formula import formula
from .peers import PEER_VERSIONS, _advantage, _aggregation, _kl, _surrogate
from .peers_sampling import (
    _batch,
    _dynamic_sampling,
    _entropy,
    _importance,
    _mask_truncated,
    _offpolicy_mask,
    _overlong,
)

AXES = {
    "advantage": _advantage,
    "surrogate": _surrogate,
    "aggregation": _aggregation,
    "kl": _kl,
    "importance_sampling": _importance,
    "offpolicy_mask": _offpolicy_mask,
    "entropy": _entropy,
    "mask_truncated": _mask_truncated,
    "overlong": _overlong,
    "dynamic_sampling": _dynamic_sampling,
    "batch": _batch,
}
_INTERFACE = {
    "trl": None,  # GRPOConfig or RLOOConfig, chosen per run
    "verl": "Hydra overrides of verl/trainer/config/ppo_trainer.yaml ('+' adds a key the defaults lack)",
    "openrlhf": "flags of python -m openrlhf.cli.train_ppo_ray",
}


def equivalents(cfg: Config) -> dict[str, dict[str, Any]]:
    """Per peer: the version checked against, the interface, and one row per axis (see ``_row``)."""
    rows = {axis: fn(cfg) for axis, fn in AXES.items()}
    if cfg.algorithm.estimator == "gae":  # PPO with a critic: its advantage and KL rows (grpolab/baselines/ppo_card.py)
        rows = ppo_card.equivalents(cfg, rows)
    out = {}
    for peer, version in PEER_VERSIONS.items():
        interface = _INTERFACE[peer] or (
            "trl.RLOOConfig" if cfg.algorithm.baseline == "leave_one_out" else "trl.GRPOConfig"
        )
        out[peer] = {
            "checked_against": f"{peer} {version}",
            "interface": interface,
            **{axis: rows[axis][peer] for axis in AXES},
        }
    return out


def peer_settings(peer_equivalents: dict[str, Any]) -> dict[str, Any]:
    """Every setting of one peer's rows merged into one mapping (what to pass to the peer); a key two rows set
    differently is an error."""
    merged: dict[str, Any] = {}
    for axis in AXES:
        for key, value in peer_equivalents[axis]["settings"].items():
            if key in merged and merged[key] != value:
                raise ValueError(f"{key}: {axis} sets {value!r}, another axis {merged[key]!r}")
            merged[key] = value
    return merged


def objective_card(cfg: Config, precision: dict[str, Any] | None = None) -> dict[str, Any]:
    """The card stored in the manifest: preset, formula (text and LaTeX), every choice, and the peer equivalents.
    ``precision``: the trainer's resolution of train.precision / rollout.dtype (grpolab.training.precision.resolve); without
    it the card shows the settings as they are ("auto" left open)."""
    text, tex = formula(cfg)
    a = cfg.algorithm
    return {
        "preset": a.preset,
        "formula": text,
        "formula_latex": tex,
        "choices": {
            "baseline": a.baseline.value,
            "scaling": a.scaling.value,
            "std_kind": a.std_kind.value,
            "adv_eps": a.adv_eps,
            "surrogate": a.surrogate.value,
            "eps_low": a.eps_low,
            "eps_high": a.eps_high,
            "dual_clip_c": a.dual_clip_c,
            **_menu_choices(cfg),
            "aggregation": a.aggregation.value,
            "l_max": cfg.l_max,
            "beta": a.beta,
            "kl_estimator": a.kl_estimator.value,
            "kl_placement": a.kl_placement.value,
            "kl_bias_correction": a.kl_bias_correction,
            "pi_old": a.pi_old,  # trainer: recomputed before the update; sampler: the sampler's q (bypass)
            "is_mode": a.is_mode.value,
            "is_c_max": a.is_c_max,
            "is_c_min": a.is_c_min,
            "is_reject": a.is_reject.value,
            "is_reject_lo": a.is_reject_lo,
            "is_reject_hi": a.is_reject_hi,
            "offpolicy_mask_delta": a.offpolicy_mask_delta,
            "pass_k": a.pass_k,
            "pass_threshold": a.pass_threshold,
            "ref_reset_every": a.ref_reset_every,
            "ref_reset_optimizer": clears_optimizer(a),  # null resolved: true when a reset is configured (ProRL)
            "distill": (
                {
                    "teacher": cfg.distill.teacher,
                    "reward_weight": cfg.distill.reward_weight,
                    "dtype": cfg.distill.dtype,
                    "nearest_peer": "TRL GKDTrainer(lmbda=1.0, beta=1.0): the full-vocabulary reverse KL per token, "
                    "not a sampled per-token advantage (not checked)",
                }
                if a.estimator == "distill"
                else "off"
            ),
            "entropy_coef": a.entropy_coef,
            "mask_truncated": a.mask_truncated,
            "overlong_buffer": a.overlong_buffer,
            "overlong_penalty": a.overlong_penalty,
            "dynamic_sampling": a.dynamic_sampling,
            "max_extra_rounds": a.max_extra_rounds,
            **_run_choices(cfg),
            "precision": card_entry(precision or unresolved(cfg.train.precision, cfg.rollout.dtype)),
            **ppo_card.choices(cfg),
        },
        "equivalents": equivalents(cfg),
        **code_extraction(cfg),
        **reward_model_card(cfg),  # the learned reward's model: hashes, template, normalisation (rewards/model.py)
        **judge_card(cfg),  # the LLM judge: identity, rubric sha256, parse rule (rewards/judge.py)
    }


def _run_choices(cfg: Config) -> dict[str, Any]:
    """The choices of the run around the objective: batch shape, engine, staleness, stop rule, LoRA, strategy, prompt
    order."""
    return {
        "mu": cfg.train.mu,
        "minibatches": cfg.train.minibatches,
        "group_size": cfg.rollout.group_size,
        "rollout_engine": cfg.rollout.engine,
        "staleness": (
            {
                "max_staleness": cfg.rollout.max_staleness,
                "schedule": f"fixed lag: the batch of step s is sampled with the weights after update "
                f"max(0, s - {cfg.rollout.max_staleness}) while the trainer updates",
                "in_flight_generations": (
                    "kept across each sync: later tokens from the new weights, each token's version recorded"
                    if cfg.rollout.engine == "vllm_server"
                    else "finish on the weights they started with (no partial rollouts)"
                ),
                "behaviour_policy": "the sampler's log-probabilities; corrected by is_mode / is_reject / "
                "offpolicy_mask_delta",
            }
            if cfg.rollout.max_staleness
            else "synchronous: each batch is sampled with the current weights"
        ),
        "stop_rule": stop_rule(cfg),
        "zero_variance_groups": "A = 0 exactly (max - min <= 1e-9)",
        "lora": (
            {
                "rank": cfg.model.lora.rank,
                "alpha": cfg.model.lora.alpha,
                "dropout": cfg.model.lora.dropout,
                "target_modules": cfg.model.lora.target_modules,
            }
            if cfg.model.lora.rank
            else "off"
        ),
        "strategy": cfg.train.strategy,
        "prompt_schedule": (
            "shuffle: each prompt once per epoch"
            if cfg.train.prompt_schedule == "shuffle"
            else f"pass_rate: a prompt whose last group was solved G/G or 0/G is skipped except with "
            f"probability {cfg.train.prompt_floor}, and taken after {math.ceil(1 / cfg.train.prompt_floor)} "
            f"skips in a row"
        ),
    }


def _menu_choices(cfg: Config) -> dict[str, Any]:
    """The parameters of the surrogate in use (cispo, sapo, clip_cov, kl_cov), and for scalerl what it leaves out."""
    a = cfg.algorithm
    out: dict[str, Any] = {f.name: getattr(a, f.name) for f in fields(PolicyLossParams)}  # by name, in order
    if a.surrogate in ("clip_cov", "kl_cov"):
        pick = "drawn at random among the eligible (the paper's, verl's)"
        if a.surrogate == "kl_cov" or a.clip_cov_select == "largest":
            pick = "the largest covariances"
        out["cov_selection"] = (
            f"per micro-batch: {pick}, n = floor(cov_ratio N + u) tokens, u uniform in [0, 1) (the expected share "
            "is cov_ratio at any micro_batch_size; verl: max(floor(cov_ratio N), 1))"
        )
    if a.surrogate in ("dppo_tv", "dppo_kl"):
        out["dppo_trust_region"] = DPPO_TRUST_REGION
    if a.surrogate == "gspo" and a.aggregation == "seq_mean_token_sum":
        out["luspo"] = "GSPO's sequence loss times |o_i| (LUSPO, arXiv 2602.05261; TRL loss_type luspo)"
    if a.preset == "scalerl":
        out["not_reproduced"] = SCALERL_NOT_REPRODUCED
    return out


DPPO_TRUST_REGION = (
    "per token, on the sampled token's probability, anchored on pi_old (the trainer's policy at the start of the "
    "update), as verl's dppo_tv / dppo_kl with bypass_mode false (at mu 1 with one minibatch p = p_old: nothing is "
    "masked, as the clip never binds); the DPPO paper's recipe (verl bypass_mode true) and "
    "prime-rl's default loss anchor on the sampler's probabilities q instead, and prime-rl's uses no ratio cap and "
    "adds 1e-3 (log pi_theta / q)^2 per token (not compared in test-peers)"
)

SCALERL_NOT_REPRODUCED = (
    "PipelineRL-8's in-flight weight updates (rollout.max_staleness: 8 gives its 8 steps of asynchrony with a fixed "
    "lag, never changing weights mid-generation), the FP32 LM head, no-positive-resampling "
    "(train.prompt_schedule pass_rate is the nearest), forced length interruptions"
)


def code_extraction(cfg: Config) -> dict[str, str]:
    """With a code reward, the rule by which the program is taken from a completion (grpolab.rewards.code)."""
    from ..rewards import reward_card

    rule = reward_card(cfg.reward.weights).get("code_extraction")
    return {"code_extraction": rule} if rule else {}
