"""The peers' equivalents of the objective's axes (advantage, surrogate, aggregation, KL): one row per peer with the
peer's own settings and a verdict, ``exact`` (same numbers), ``nearest`` (the difference in one phrase) or ``none``.
The sampling-side axes are in card/peers_sampling.py."""

from __future__ import annotations

from typing import Any

from ..config import Config
from .formula import _RATIO

PEER_VERSIONS = {"trl": "1.16.0", "verl": "0.9.1", "openrlhf": "0.11.2"}
EXACT, NEAREST, NONE = "exact", "nearest", "none"
# verl's vanilla loss always applies the dual clip at clip_ratio_c; its ratio is at most e^20 (log-ratio clamped at
# 20), so any c above that switches the cap off.
VERL_NO_DUAL_CLIP = 1e9
# OpenRLHF clamps every advantage to --reward.clip_range (default -10 10); this range switches the clamp off.
OPENRLHF_NO_REWARD_CLIP = [-1e9, 1e9]
STD_EPS = {"trl": 1e-4, "verl": 1e-6, "openrlhf": 1e-9}  # the fixed epsilon each peer adds to the std
_VERL_KL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


def _row(match: str, settings: dict[str, Any] | None = None, difference: str = "", **extra: Any) -> dict[str, Any]:
    """One peer's equivalent of one axis: verdict, the peer's settings, the difference (``nearest``/``none``)."""
    row: dict[str, Any] = {"match": match, "settings": settings or {}}
    if difference:
        row["difference"] = difference
    return {**row, **extra}


def _unless(differences: list[str], settings: dict[str, Any]) -> dict[str, Any]:
    """``exact`` when there is no difference, else ``nearest`` with the differences joined."""
    return _row(NEAREST if differences else EXACT, settings, "; ".join(differences))


def _std_differences(cfg: Config, peer: str) -> list[str]:
    """What a peer's fixed 'std + eps' (sample std) changes against grpolab's std_kind / adv_eps."""
    a, eps = cfg.algorithm, STD_EPS[peer]
    out = [] if a.adv_eps == eps else [f"divides by std + {eps:.0e} (fixed)".replace("e-0", "e-")]
    return out + (["sample std (n - 1)"] if a.std_kind == "population" else [])


UNCHECKED_ESTIMATORS = {
    "maxrl": "not compared with a peer's code here (MaxRL, arXiv 2602.02710: the paper's formula, float64 tests)",
    "gdpo": "not compared with a peer's code here (TRL's multi_objective_aggregation='normalize_then_sum' and verl's "
    "gdpo estimator are its peer forms, not yet run in test-peers; GDPO, arXiv 2601.05242: the paper's formula, "
    "float64 tests)",
}


def _advantage(cfg: Config) -> dict[str, dict]:
    a = cfg.algorithm
    s, est = a.scaling.value, "--algo.advantage.estimator"
    if a.estimator == "pass_at_k":
        none = "no pass@k advantage"
        verl = "grpo_passk is another estimator (arXiv 2503.19595: only the group's best sample gets r_max - r_2nd)"
        return {"trl": _row(NONE, {}, none), "verl": _row(NONE, {}, verl), "openrlhf": _row(NONE, {}, none)}
    if a.estimator in UNCHECKED_ESTIMATORS:  # checked against the paper's formula in float64 (tests/algo)
        row = _row(NONE, {}, UNCHECKED_ESTIMATORS[a.estimator])
        return {"trl": row, "verl": dict(row), "openrlhf": dict(row)}
    if a.baseline == "batch_mean":  # REINFORCE++'s global baseline: the peers' versions whiten per token
        unchecked = _row(
            NONE,
            {},
            "no sequence-level batch-mean baseline: REINFORCE++ (verl reinforce_plus_plus, OpenRLHF reinforce) whitens "
            "over tokens, each sequence weighted by its length (the same only when every length is equal)",
        )
        return {"trl": unchecked, "verl": dict(unchecked), "openrlhf": {**unchecked, "settings": {}}}
    if a.baseline == "leave_one_out":
        no_std = [] if s == "none" else ["no std scaling"]
        trl = (
            _row(NEAREST, {"normalize_advantages": True}, "re-centres on the batch mean, then divides by std + 1e-4")
            if s == "batch_std"
            else _unless(no_std, {"normalize_advantages": False})
        )
        verl, orl = _unless(no_std, {"algorithm.adv_estimator": "rloo"}), _unless(no_std, {est: "rloo"})
    elif s == "batch_std":
        whiten = "group mean, then token-level whitening over the batch (re-centred, population std)"
        trl = _unless(_std_differences(cfg, "trl"), {"scale_rewards": "batch"})
        verl = _row(NEAREST, {"algorithm.adv_estimator": "reinforce_plus_plus_baseline"}, whiten)
        orl = _row(NEAREST, {est: "reinforce_baseline"}, whiten)
    else:
        std = s == "group_std"
        d = {p: _std_differences(cfg, p) if std else [] for p in STD_EPS}
        trl = _unless(d["trl"], {"scale_rewards": "group" if std else "none"})
        verl = _unless(d["verl"], {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": std})
        orl = _unless(d["openrlhf"], {est: "group_norm" if std else "dr_grpo"})
    orl["settings"]["--reward.clip_range"] = list(OPENRLHF_NO_REWARD_CLIP)
    return {"trl": trl, "verl": verl, "openrlhf": orl}


def _surrogate(cfg: Config) -> dict[str, dict]:
    a = cfg.algorithm
    if a.surrogate.value not in _RATIO:
        return _menu_surrogate(cfg)
    gspo, dual = a.surrogate == "gspo", a.surrogate == "dual_clip"
    clip = {"epsilon": a.eps_low, "epsilon_high": a.eps_high}
    if a.baseline == "leave_one_out":
        trl = _row(
            NEAREST,
            clip,
            "RLOOTrainer clips the sequence ratio exp(sum_t log r_it), one term per sequence"
            + (", no dual clip" if dual else ""),
        )
    else:
        low_delta = dual and a.dual_clip_c <= 1 + a.eps_high
        level, delta = "sequence" if gspo else "token", a.dual_clip_c if dual else None
        trl = _unless(
            ["delta caps the ratio for both signs of A (it needs delta > 1 + epsilon_high)"] if low_delta else [],
            {**clip, "importance_sampling_level": level, "delta": delta},
        )
    actor = "actor_rollout_ref.actor."
    verl_settings = {
        f"{actor}policy_loss.loss_mode": "gspo" if gspo else "vanilla",
        f"{actor}clip_ratio_low": a.eps_low,
        f"{actor}clip_ratio_high": a.eps_high,
    }
    if not gspo:
        verl_settings[f"{actor}clip_ratio_c"] = a.dual_clip_c if dual else VERL_NO_DUAL_CLIP
    orl_settings = {
        "--actor.policy_loss_type": "gspo" if gspo else "ppo",
        "--actor.eps_clip_low_high": [a.eps_low, a.eps_high],
    }
    if dual:
        orl_settings["--actor.dual_clip"] = a.dual_clip_c
    return {"trl": trl, "verl": _row(EXACT, verl_settings), "openrlhf": _row(EXACT, orl_settings)}


_TRL_LOSS = {"cispo": "cispo", "sapo": "sapo"}  # surrogates TRL selects by loss_type, and the aggregation it implies
_TRL_LOSS_AGG = {"cispo": "token_mean", "sapo": "seq_mean_token_mean"}
_VERL_MODE = {
    "cispo": "cispo",
    "gmpo": "geo_mean",
    "sapo": "sapo",
    "clip_cov": "clip_cov",
    "kl_cov": "kl_cov",
    "dppo_tv": "dppo_tv",
    "dppo_kl": "dppo_kl",
}


def _menu_surrogate(cfg: Config) -> dict[str, dict]:
    """Peer rows of cispo, gmpo, sapo, clip_cov, kl_cov, dppo_tv and dppo_kl."""
    a, kind = cfg.algorithm, cfg.algorithm.surrogate.value
    actor, pl = "actor_rollout_ref.actor.", "actor_rollout_ref.actor.policy_loss."
    if a.baseline == "leave_one_out":
        trl = _row(NONE, {}, f"RLOOTrainer has no {kind} loss")
    elif kind == "cispo":
        low = [] if a.cispo_eps_low >= 1 else ["no lower bound on the weight"]
        trl = _unless(low, {"loss_type": "cispo", "epsilon_high": round(1 + a.cispo_eps_high, 12)})
    elif kind == "sapo":
        trl = _row(
            EXACT,
            {"loss_type": "sapo", "sapo_temperature_pos": a.sapo_tau_pos, "sapo_temperature_neg": a.sapo_tau_neg},
        )
    else:
        trl = _row(NONE, {}, f"GRPOTrainer has no {kind} loss")
    verl_settings: dict[str, Any] = {f"{pl}loss_mode": _VERL_MODE[kind]}
    if kind in ("dppo_tv", "dppo_kl"):  # verl reads the divergence bounds from clip_ratio_low / _high, the cap from _c
        verl_settings.update(
            {
                f"{actor}clip_ratio_low": a.dppo_low,
                f"{actor}clip_ratio_high": a.dppo_high,
                f"{actor}clip_ratio_c": a.dppo_ratio_cap,
            }
        )
        return {
            "trl": trl,
            "verl": _row(EXACT, verl_settings),
            "openrlhf": _row(NONE, {}, "--actor.policy_loss_type has only ppo and gspo"),
        }
    differences: list[str] = []
    if kind == "cispo":
        verl_settings.update({f"{actor}clip_ratio_low": a.cispo_eps_low, f"{actor}clip_ratio_high": a.cispo_eps_high})
    elif kind == "sapo":
        verl_settings.update({f"{actor}tau_pos": a.sapo_tau_pos, f"{actor}tau_neg": a.sapo_tau_neg})
    else:
        verl_settings.update({f"{actor}clip_ratio_low": a.eps_low, f"{actor}clip_ratio_high": a.eps_high})
    if kind == "clip_cov":
        verl_settings.update(
            {
                f"{pl}clip_cov_ratio": a.cov_ratio,
                f"{pl}clip_cov_lb": a.clip_cov_lb,
                f"{pl}clip_cov_ub": a.clip_cov_ub,
            }
        )
        if a.cov_ratio < 1 and a.clip_cov_select == "largest":
            differences.append("draws the selected tokens at random among the eligible ones, not the largest first")
        elif a.cov_ratio < 1:
            differences.append("draws from torch's global generator, grpolab from a stream seeded by train.seed")
    elif kind == "kl_cov":
        verl_settings.update({f"{pl}kl_cov_ratio": a.cov_ratio, f"{pl}ppo_kl_coef": a.kl_cov_coef})
    if kind in ("clip_cov", "kl_cov") and a.cov_ratio < 1:  # cov_ratio 1: every (eligible) token both ways
        differences.append("selects max(floor(rho N), 1) tokens per micro-batch, grpolab floor(rho N + u), u uniform")
    return {
        "trl": trl,
        "verl": _unless(differences, verl_settings),
        "openrlhf": _row(NONE, {}, "--actor.policy_loss_type has only ppo and gspo"),
    }


def _aggregation(cfg: Config) -> dict[str, dict]:
    a = cfg.algorithm
    agg = a.aggregation.value
    loss_type = {
        "seq_mean_token_mean": "grpo",
        "token_mean": "dapo",
        "seq_mean_token_sum_norm": "dr_grpo",
        "seq_mean_token_sum": "luspo",
    }.get(agg, "")
    trl_loss = _TRL_LOSS.get(a.surrogate.value)
    if a.baseline == "leave_one_out":
        trl = _row(NEAREST, {}, "RLOOTrainer has one sequence-level term per sequence, mean over sequences")
    elif trl_loss and agg != _TRL_LOSS_AGG[trl_loss]:
        trl = _row(NONE, {}, f"loss_type={trl_loss} aggregates {_TRL_LOSS_AGG[trl_loss]}")
    elif trl_loss:
        trl = (
            _row(EXACT, {"loss_type": trl_loss})
            if cfg.train.minibatches == 1 or agg != "token_mean"
            else _row(
                NEAREST,
                {"loss_type": trl_loss},
                "divides each optimizer step by the generation batch's tokens / steps, not by its own",
            )
        )
    elif agg == "prompt_mean_token_mean":
        trl = _row(NONE, {}, "no loss_type averages tokens per prompt group")
    elif agg == "token_mean" and cfg.train.minibatches > 1:
        trl = _row(
            NEAREST,
            {"loss_type": loss_type},
            "divides each optimizer step by the generation batch's tokens / steps, not by its own",
        )
    elif agg == "seq_mean_token_sum_norm" and cfg.l_max != cfg.rollout.max_new_tokens:
        trl = _row(NEAREST, {"loss_type": loss_type}, "the constant is max_completion_length, not l_max")
    else:
        trl = _row(EXACT, {"loss_type": loss_type})
    verl_settings: dict[str, Any] = {"actor_rollout_ref.actor.loss_agg_mode": agg.replace("_", "-")}
    if agg == "seq_mean_token_sum_norm":
        verl_settings["actor_rollout_ref.actor.loss_scale_factor"] = cfg.l_max
    fixed = {"gmpo": "geo_mean averages the sequence losses", "sapo": "sapo always aggregates seq-mean-token-mean"}
    if agg == "prompt_mean_token_mean":
        verl = _row(NONE, {}, "loss_agg_mode has no per-prompt token mean")
    elif a.surrogate.value in fixed and agg != "seq_mean_token_mean":
        verl = _row(NEAREST, {}, fixed[a.surrogate.value])
    else:
        verl = _row(EXACT, verl_settings)
    if agg == "prompt_mean_token_mean":
        orl = _row(NONE, {}, "--actor.loss_agg_mode has only token-mean and seq-mean-token-mean")
    elif a.surrogate == "gspo" and agg != "seq_mean_token_mean":
        orl = _row(NONE, {}, "OpenRLHF's GSPO always aggregates seq-mean-token-mean")
    elif agg in ("token_mean", "seq_mean_token_mean"):
        orl = _row(EXACT, {"--actor.loss_agg_mode": agg.replace("_", "-")})
    else:
        orl = _row(NONE, {}, "--actor.loss_agg_mode has only token-mean and seq-mean-token-mean")
    return {"trl": trl, "verl": verl, "openrlhf": orl}


def _trl_kl_differences(cfg: Config) -> list[str]:
    """What TRL's KL in the loss computes otherwise: k3 only; use_bias_correction_kl weights by coef_1, the sequence
    ratio s_i under importance_sampling_level=sequence (gspo), where grpolab weights by the token ratio r_it."""
    a = cfg.algorithm
    out = [] if a.kl_estimator == "k3" else ["k3 only"]
    if a.kl_bias_correction and a.surrogate == "gspo":
        out.append("weights the KL by the sequence ratio s_i (importance_sampling_level=sequence), not r_it")
    return out


def _kl(cfg: Config) -> dict[str, dict]:
    a = cfg.algorithm
    est, in_loss = a.kl_estimator.value, a.kl_placement == "loss"
    actor, vtype = "actor_rollout_ref.actor.", _VERL_KL[est]
    if a.beta == 0:
        return {
            "trl": _row(EXACT, {"beta": 0.0}),
            "verl": _row(EXACT, {f"{actor}use_kl_loss": False, "algorithm.use_kl_in_reward": False}),
            "openrlhf": _row(
                EXACT, {"--algo.kl.init_coef": 0.0}, note="OpenRLHF's default 0.01 puts a KL term in the reward"
            ),
        }
    if a.baseline == "leave_one_out":
        trl = (
            _row(NONE, {}, "RLOOTrainer puts KL only in the reward")
            if in_loss
            else _unless([] if est == "k1" else ["k1 only"], {"beta": a.beta})
        )
    else:
        trl = (
            _unless(_trl_kl_differences(cfg), {"beta": a.beta, "use_bias_correction_kl": a.kl_bias_correction})
            if in_loss
            else _row(NONE, {}, "GRPOTrainer puts KL only in the loss")
        )
    clamp = ["k3 clamped to [-10, 10]"] if est == "k3" else []
    # their nearest to DeepSeek-V3.2's unbiased KL: the same KL in the loss, unweighted
    unweighted = ["no weighting of the KL by pi_theta / pi_old (DeepSeek-V3.2's unbiased KL)"] * a.kl_bias_correction
    if in_loss:
        verl = _unless(
            clamp + unweighted,
            {
                f"{actor}use_kl_loss": True,
                f"{actor}kl_loss_coef": a.beta,
                f"{actor}kl_loss_type": vtype,
                "algorithm.use_kl_in_reward": False,
            },
        )
        token_mean = (
            [] if a.aggregation == "token_mean" else ["the KL term is token-mean whatever --actor.loss_agg_mode"]
        )
        orl = _unless(
            ["estimate clamped to [-10, 10]"] + token_mean + unweighted,
            {"--algo.kl.use_loss": True, "--algo.kl.init_coef": a.beta, "--algo.kl.estimator": est},
        )
    else:
        verl = _unless(
            clamp,
            {
                "algorithm.use_kl_in_reward": True,
                "algorithm.kl_penalty": vtype,
                "algorithm.kl_ctrl.type": "fixed",
                "algorithm.kl_ctrl.kl_coef": a.beta,
                f"{actor}use_kl_loss": False,
            },
        )
        orl = _row(
            NEAREST,
            {"--algo.kl.init_coef": a.beta, "--algo.kl.estimator": est},
            "KL enters each token's reward-to-go after group normalisation, not R_i before it",
        )
    return {"trl": trl, "verl": verl, "openrlhf": orl}
