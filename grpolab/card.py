"""The objective card: the resolved objective as a formula, every choice, and the peer settings that match it.

Printed at the start of a run and stored in the manifest, so two runs that both say "GRPO" can be told apart.
For each peer the card names the version it was checked against (``PEER_VERSIONS``) and, per axis of the
objective, the peer's own settings (TRL config fields, verl Hydra overrides of ``trainer/config/ppo_trainer.yaml``,
OpenRLHF ``train_ppo_ray`` flags) with a verdict: ``exact`` (same numbers), ``nearest`` (with the difference in
one phrase) or ``none``. ``tests/test_card_peers.py`` feeds these settings to each peer's own config code and
compares numbers with the peer's own functions.

"Exact" is meant on batches in which every completion keeps at least one loss token (peers count fully masked
rows differently) and ignores clamps that act only on log-ratios beyond +-20.
"""

from __future__ import annotations

import math
from typing import Any

from .baselines import ppo_card
from .config import Config
from .rewards import stop_rule
from .rewards.judge import judge_card
from .rewards.model import reward_model_card
from .training.precision import card_entry, unresolved

PEER_VERSIONS = {"trl": "1.16.0", "verl": "0.9.1", "openrlhf": "0.11.2"}
EXACT, NEAREST, NONE = "exact", "nearest", "none"
# verl's vanilla loss always applies the dual clip at clip_ratio_c; its ratio is at most e^20 (log-ratio clamped at
# 20), so any c above that switches the cap off.
VERL_NO_DUAL_CLIP = 1e9
# OpenRLHF clamps every advantage to --reward.clip_range (default -10 10); this range switches the clamp off.
OPENRLHF_NO_REWARD_CLIP = [-1e9, 1e9]
STD_EPS = {"trl": 1e-4, "verl": 1e-6, "openrlhf": 1e-9}  # the fixed epsilon each peer adds to the std
_VERL_KL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}

_ADV_TEXT = {
    ("group_mean", "group_std"): (
        "(R_i - mean_g R) / (std_g R + {eps})",
        r"\frac{R_i - \mathrm{mean}_g R}{\mathrm{std}_g R + \epsilon}",
    ),
    ("group_mean", "batch_std"): (
        "(R_i - mean_g R) / (std_batch R + {eps})",
        r"\frac{R_i - \mathrm{mean}_g R}{\mathrm{std}_B R + \epsilon}",
    ),
    ("group_mean", "none"): ("R_i - mean_g R", r"R_i - \mathrm{mean}_g R"),
    ("leave_one_out", "group_std"): (
        "(R_i - mean_{j!=i} R_j) / (std_g R + {eps})",
        r"\frac{R_i - \mathrm{mean}_{j \ne i} R_j}{\mathrm{std}_g R + \epsilon}",
    ),
    ("leave_one_out", "batch_std"): (
        "(R_i - mean_{j!=i} R_j) / (std_batch R + {eps})",
        r"\frac{R_i - \mathrm{mean}_{j \ne i} R_j}{\mathrm{std}_B R + \epsilon}",
    ),
    ("leave_one_out", "none"): ("R_i - mean_{j!=i} R_j", r"R_i - \mathrm{mean}_{j \ne i} R_j"),
    ("batch_mean", "batch_std"): (
        "(R_i - mean_batch R) / (std_batch R + {eps})",
        r"\frac{R_i - \mathrm{mean}_B R}{\mathrm{std}_B R + \epsilon}",
    ),
    ("batch_mean", "none"): ("R_i - mean_batch R", r"R_i - \mathrm{mean}_B R"),
}
_AGG_TEXT = {
    "seq_mean_token_mean": ("(1/B) sum_i (1/|o_i|) sum_t", r"\frac{1}{B}\sum_i \frac{1}{|o_i|}\sum_t"),
    "token_mean": ("(1/sum_i |o_i|) sum_i sum_t", r"\frac{1}{\sum_i |o_i|}\sum_i\sum_t"),
    "seq_mean_token_sum_norm": ("(1/(B*{lmax})) sum_i sum_t", r"\frac{1}{B \cdot L_{max}}\sum_i\sum_t"),
    "seq_mean_token_sum": ("(1/B) sum_i sum_t", r"\frac{1}{B}\sum_i\sum_t"),
    "prompt_mean_token_mean": (
        "(1/P) sum_g (1/sum_{i in g} |o_i|) sum_{i in g} sum_t",
        r"\frac{1}{P}\sum_g \frac{1}{\sum_{i \in g} |o_i|}\sum_{i \in g}\sum_t",
    ),
}
_RATIO = {
    "gspo": ("s_i = exp(mean_t log r_it)", r"s_i"),
    "ppo_clip": ("r_it", r"r_{i,t}"),
    "dual_clip": ("r_it", r"r_{i,t}"),
}


def _menu_term(cfg: Config, adv: str, adv_tex: str) -> tuple[str, str]:
    """(text, LaTeX) of `L = <agg> [ l_it` for the surrogates whose token loss is not a PPO clip of a ratio."""
    a = cfg.algorithm
    agg, agg_tex = _AGG_TEXT[a.aggregation.value]
    agg = agg.replace("{lmax}", str(cfg.l_max))
    r, lo, hi = "r_it", a.eps_low, a.eps_high
    if a.surrogate == "cispo":
        clo, chi = round(1 - a.cispo_eps_low, 12), round(1 + a.cispo_eps_high, 12)
        return (
            f"L = {agg} [ -sg(clip({r}, {clo}, {chi})) {adv} log pi_theta(o_it)",
            rf"\mathcal{{L}} = {agg_tex}\Big[-\mathrm{{sg}}\big(\mathrm{{clip}}(r_{{i,t}}, {clo}, {chi})\big) "
            rf"{adv_tex} \log\pi_\theta(o_{{i,t}})",
        )
    if a.surrogate == "gmpo":
        return (
            f"L = {agg} [ -{adv} exp(mean_t sgn({adv}) min(sgn({adv}) log {r}, sgn({adv}) clip(log {r}, -{lo}, {hi})))",
            rf"\mathcal{{L}} = {agg_tex}\Big[-{adv_tex} \exp\big(\frac{{1}}{{|o_i|}}\sum_t \mathrm{{sgn}}({adv_tex})"
            rf"\min(\mathrm{{sgn}}({adv_tex})\log r_{{i,t}}, \mathrm{{sgn}}({adv_tex})\,\mathrm{{clip}}(\log r_{{i,t}}, "
            rf"-{lo}, {hi}))\big)",
        )
    if a.surrogate == "sapo":
        tau = f"tau = {a.sapo_tau_pos} if {adv} > 0 else {a.sapo_tau_neg}"
        return (
            f"L = {agg} [ -(4/tau) sigmoid(tau ({r} - 1)) {adv} ({tau})",
            rf"\mathcal{{L}} = {agg_tex}\Big[-\frac{{4}}{{\tau}}\sigma\big(\tau (r_{{i,t}} - 1)\big) {adv_tex}"
            rf"\ (\tau = {a.sapo_tau_pos}\ \text{{if }} {adv_tex} > 0,\ {a.sapo_tau_neg}\ \text{{else}})",
        )
    if a.surrogate == "clip_cov":
        sel = f"the top {a.cov_ratio} of unclipped tokens by cov(A, log pi) in ({a.clip_cov_lb}, {a.clip_cov_ub})"
        return (
            f"L = {agg} [ -min({r} {adv}, clip({r}, 1-{lo}, 1+{hi}) {adv}) * (0 on {sel})",
            rf"\mathcal{{L}} = -{agg_tex}\Big[\min\big(r_{{i,t}} {adv_tex},\ \mathrm{{clip}}(r_{{i,t}}, 1-{lo}, 1+{hi})"
            rf" {adv_tex}\big) \cdot \mathbb{{1}}[(i,t) \notin \mathcal{{I}}_{{cov}}]",
        )
    return (
        f"L = {agg} [ -{r} {adv} + {a.kl_cov_coef} |log {r}| on the top {a.cov_ratio} of tokens by cov(A, log pi)",
        rf"\mathcal{{L}} = {agg_tex}\Big[-r_{{i,t}} {adv_tex} + {a.kl_cov_coef}\,|\log r_{{i,t}}|\,"
        rf"\mathbb{{1}}[(i,t) \in \mathcal{{I}}_{{cov}}]",
    )


def policy_loss(cfg: Config, adv: str = "A_i", adv_tex: str = "A_i") -> tuple[str, str]:
    """(plain text, LaTeX) of the policy loss as it is optimised -- the run's aggregation, surrogate, IS correction,
    KL in the loss and entropy bonus -- with the advantage written `adv` / `adv_tex`: GRPO's sequence advantage
    A_i, or PPO's per-token A_it (grpolab.baselines.ppo_card)."""
    a = cfg.algorithm
    agg, agg_tex = _AGG_TEXT[a.aggregation.value]
    if a.surrogate.value in _RATIO:
        r, r_tex = _RATIO[a.surrogate.value]
        text = f"L = -{agg.replace('{lmax}', str(cfg.l_max))} [ min({r} {adv}, clip({r}, 1-{a.eps_low}, 1+{a.eps_high}) {adv})"
        tex = (
            rf"\mathcal{{L}} = -{agg_tex}\Big[\min\big({r_tex} {adv_tex},\ \mathrm{{clip}}({r_tex}, 1-{a.eps_low}, "
            rf"1+{a.eps_high}) {adv_tex}\big)"
        )
    else:
        text, tex = _menu_term(cfg, adv, adv_tex)
    if a.surrogate == "dual_clip":
        text += f", capped at {a.dual_clip_c} {adv} for {adv} < 0"
        tex += rf"\ \text{{(dual clip }}c={a.dual_clip_c}\text{{)}}"
    if a.is_mode != "none":
        text += f" * w_IS[{a.is_mode}]"
        tex += r" \cdot w^{IS}"
    if a.is_reject != "none":
        text += f" * 1[exp(mean_t log(pi_old/q)) in [{a.is_reject_lo}, {a.is_reject_hi}]]"
        tex += rf" \cdot \mathbb{{1}}\big[g_i \in [{a.is_reject_lo}, {a.is_reject_hi}]\big]"
    if a.offpolicy_mask_delta > 0:
        text += f" * 1[not ({adv} < 0 and mean_t (log q - log pi_theta) > {a.offpolicy_mask_delta})]"
        tex += rf" \cdot M_i^{{\delta={a.offpolicy_mask_delta}}}"
    if a.beta > 0 and a.kl_placement == "loss":
        text += f" - {a.beta} KL_{a.kl_estimator.value}(pi_theta || pi_ref)"
        tex += rf" - {a.beta}\,\mathrm{{KL}}_{{{a.kl_estimator.value}}}"
    if a.entropy_coef:
        text += f" + {a.entropy_coef} H_it"
        tex += rf" + {a.entropy_coef} H_{{i,t}}"
    return text + " ]", tex + r"\Big]"


def _pass_at_k_text(a: Any) -> tuple[str, str]:
    """A_i of algorithm.estimator = pass_at_k (grpolab.algo.advantages.pass_at_k_group): N_g valid samples in the
    group, F_g of them failing (R < pass_threshold), P_g the group's unbiased pass@k."""
    k, tau = a.pass_k, a.pass_threshold
    text = (
        f"(1 - P_g - [R_i < {tau}] C(F_g - 1, {k - 1}) / C(N_g - 1, {k - 1})) / (sqrt(P_g (1 - P_g)) + {{eps}}), "
        f"P_g = 1 - C(F_g, {k}) / C(N_g, {k})"
    )
    tex = (
        rf"\frac{{1 - P_g - [R_i < {tau}]\,\binom{{F_g - 1}}{{{k - 1}}} / \binom{{N_g - 1}}{{{k - 1}}}}}"
        rf"{{\sqrt{{P_g (1 - P_g)}} + \epsilon}},\ P_g = 1 - \binom{{F_g}}{{{k}}} / \binom{{N_g}}{{{k}}}"
    )
    return text, tex


def formula(cfg: Config) -> tuple[str, str]:
    """(plain text, LaTeX) of the minimised loss."""
    if cfg.algorithm.estimator == "gae":  # PPO with a critic: the same policy loss, per-token advantages
        return ppo_card.formula(cfg, *policy_loss(cfg, "A_it", "A_{i,t}"))
    a = cfg.algorithm
    adv, adv_tex = _pass_at_k_text(a) if a.estimator == "pass_at_k" else _ADV_TEXT[(a.baseline.value, a.scaling.value)]
    text, tex = policy_loss(cfg)
    text += f",  A_i = {adv.replace('{eps}', str(a.adv_eps))}"
    tex += rf",\quad A_i = {adv_tex}"
    if a.beta > 0 and a.kl_placement == "reward":
        text += f",  R_i <- R_i - {a.beta} sum_t KL_{a.kl_estimator.value}"
        tex += rf",\quad R_i \leftarrow R_i - {a.beta}\sum_t \mathrm{{KL}}_{{{a.kl_estimator.value}}}"
    return text, tex


# --------------------------------------------------------------------------------------------- peer rows


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


def _advantage(cfg: Config) -> dict[str, dict]:
    a = cfg.algorithm
    s, est = a.scaling.value, "--algo.advantage.estimator"
    if a.estimator == "pass_at_k":
        none = "no pass@k advantage"
        verl = "grpo_passk is another estimator (arXiv 2503.19595: only the group's best sample gets r_max - r_2nd)"
        return {"trl": _row(NONE, {}, none), "verl": _row(NONE, {}, verl), "openrlhf": _row(NONE, {}, none)}
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
_VERL_MODE = {"cispo": "cispo", "gmpo": "geo_mean", "sapo": "sapo", "clip_cov": "clip_cov", "kl_cov": "kl_cov"}


def _menu_surrogate(cfg: Config) -> dict[str, dict]:
    """Peer rows of cispo, gmpo, sapo, clip_cov and kl_cov."""
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
        if a.cov_ratio < 1:
            differences.append("draws the selected tokens at random among the eligible ones, not the largest first")
    elif kind == "kl_cov":
        verl_settings.update({f"{pl}kl_cov_ratio": a.cov_ratio, f"{pl}ppo_kl_coef": a.kl_cov_coef})
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
            _unless([] if est == "k3" else ["k3 only"], {"beta": a.beta, "use_bias_correction_kl": False})
            if in_loss
            else _row(NONE, {}, "GRPOTrainer puts KL only in the loss")
        )
    clamp = ["k3 clamped to [-10, 10]"] if est == "k3" else []
    if in_loss:
        verl = _unless(
            clamp,
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
            ["estimate clamped to [-10, 10]"] + token_mean,
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


def _importance(cfg: Config) -> dict[str, dict]:
    """The IS weighting's rows, with the geometric rejection folded in (verl: rollout_rs; the others: none)."""
    rows = _is_weighting(cfg)
    a = cfg.algorithm
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
    trl = (
        _row(NONE, {}, "RLOOTrainer has no sampler-mismatch correction")
        if loo
        else _row(
            EXACT,
            {
                "use_vllm": True,
                "vllm_importance_sampling_correction": True,
                "vllm_importance_sampling_mode": mode,
                "vllm_importance_sampling_clip_max": a.is_c_max,
                "vllm_importance_sampling_clip_min": None if truncate else a.is_c_min,
            },
        )
    )
    threshold = a.is_c_max if truncate else f"{a.is_c_min}_{a.is_c_max}"  # verl: C = truncate, "low_high" = mask
    verl = _row(
        EXACT,
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
            f"{flag}threshold": [0.0 if truncate else a.is_c_min, a.is_c_max],
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
            "ref_reset_optimizer": a.ref_reset_optimizer,
            "entropy_coef": a.entropy_coef,
            "mask_truncated": a.mask_truncated,
            "overlong_buffer": a.overlong_buffer,
            "overlong_penalty": a.overlong_penalty,
            "dynamic_sampling": a.dynamic_sampling,
            "max_extra_rounds": a.max_extra_rounds,
            "mu": cfg.train.mu,
            "minibatches": cfg.train.minibatches,
            "group_size": cfg.rollout.group_size,
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
            "precision": card_entry(precision or unresolved(cfg.train.precision, cfg.rollout.dtype)),
            **ppo_card.choices(cfg),
        },
        "equivalents": equivalents(cfg),
        **code_extraction(cfg),
        **reward_model_card(cfg),  # the learned reward's model: hashes, template, normalisation (rewards/model.py)
        **judge_card(cfg),  # the LLM judge: identity, rubric sha256, parse rule (rewards/judge.py)
    }


def _menu_choices(cfg: Config) -> dict[str, Any]:
    """The parameters of the surrogate in use (cispo, sapo, clip_cov, kl_cov), and for scalerl what it leaves out."""
    a = cfg.algorithm
    out: dict[str, Any] = {
        "cispo_eps_low": a.cispo_eps_low,
        "cispo_eps_high": a.cispo_eps_high,
        "sapo_tau_pos": a.sapo_tau_pos,
        "sapo_tau_neg": a.sapo_tau_neg,
        "cov_ratio": a.cov_ratio,
        "clip_cov_lb": a.clip_cov_lb,
        "clip_cov_ub": a.clip_cov_ub,
        "kl_cov_coef": a.kl_cov_coef,
    }
    if a.surrogate in ("clip_cov", "kl_cov"):
        out["cov_selection"] = "per micro-batch (as verl): the n largest covariances, n = max(floor(cov_ratio N), 1)"
    if a.preset == "scalerl":
        out["not_reproduced"] = SCALERL_NOT_REPRODUCED
    return out


SCALERL_NOT_REPRODUCED = (
    "PipelineRL-8 (asynchronous generation with in-flight weight updates), the FP32 LM head, no-positive-resampling "
    "(train.prompt_schedule pass_rate is the nearest), forced length interruptions"
)


def code_extraction(cfg: Config) -> dict[str, str]:
    """With a code reward, the rule by which the program is taken from a completion (grpolab.rewards.code)."""
    from .rewards import reward_card

    rule = reward_card(cfg.reward.weights).get("code_extraction")
    return {"code_extraction": rule} if rule else {}
