"""The objective card: the resolved objective as a formula, every choice, and the nearest peer settings.

Printed at the start of a run and stored in the manifest, so two runs that both say "GRPO" can be told apart.
Peer names are the nearest equivalents in TRL's GRPOConfig, verl's actor/algorithm config and OpenRLHF's
CLI flags; where a peer has no equivalent the card says so rather than guessing.
"""

from __future__ import annotations

from typing import Any

from .config import Config

NONE = "no equivalent"

_ADV_TEXT = {
    ("group_mean", "group_std"): ("(R_i - mean_g R) / (std_g R + {eps})", r"\frac{R_i - \mathrm{mean}_g R}{\mathrm{std}_g R + \epsilon}"),
    ("group_mean", "batch_std"): ("(R_i - mean_g R) / (std_batch R + {eps})", r"\frac{R_i - \mathrm{mean}_g R}{\mathrm{std}_B R + \epsilon}"),
    ("group_mean", "none"): ("R_i - mean_g R", r"R_i - \mathrm{mean}_g R"),
    ("leave_one_out", "group_std"): ("(R_i - mean_{j!=i} R_j) / (std_g R + {eps})", r"\frac{R_i - \mathrm{mean}_{j \ne i} R_j}{\mathrm{std}_g R + \epsilon}"),
    ("leave_one_out", "batch_std"): ("(R_i - mean_{j!=i} R_j) / (std_batch R + {eps})", r"\frac{R_i - \mathrm{mean}_{j \ne i} R_j}{\mathrm{std}_B R + \epsilon}"),
    ("leave_one_out", "none"): ("R_i - mean_{j!=i} R_j", r"R_i - \mathrm{mean}_{j \ne i} R_j"),
}
_AGG_TEXT = {
    "seq_mean_token_mean": ("(1/B) sum_i (1/|o_i|) sum_t", r"\frac{1}{B}\sum_i \frac{1}{|o_i|}\sum_t"),
    "token_mean": ("(1/sum_i |o_i|) sum_i sum_t", r"\frac{1}{\sum_i |o_i|}\sum_i\sum_t"),
    "seq_mean_token_sum_norm": ("(1/(B*{lmax})) sum_i sum_t", r"\frac{1}{B \cdot L_{max}}\sum_i\sum_t"),
    "seq_mean_token_sum": ("(1/B) sum_i sum_t", r"\frac{1}{B}\sum_i\sum_t"),
}
_RATIO = {"gspo": ("s_i = exp(mean_t log r_it)", r"s_i"), "ppo_clip": ("r_it", r"r_{i,t}"), "dual_clip": ("r_it", r"r_{i,t}")}


def formula(cfg: Config) -> tuple[str, str]:
    """(plain text, LaTeX) of the minimised loss."""
    a = cfg.algorithm
    adv, adv_tex = _ADV_TEXT[(a.baseline.value, a.scaling.value)]
    agg, agg_tex = _AGG_TEXT[a.aggregation.value]
    r, r_tex = _RATIO[a.surrogate.value]
    text = f"L = -{agg.replace('{lmax}', str(cfg.l_max))} [ min({r} A_i, clip({r}, 1-{a.eps_low}, 1+{a.eps_high}) A_i)"
    tex = rf"\mathcal{{L}} = -{agg_tex}\Big[\min\big({r_tex} A_i,\ \mathrm{{clip}}({r_tex}, 1-{a.eps_low}, 1+{a.eps_high}) A_i\big)"
    if a.surrogate == "dual_clip":
        text += f", capped at {a.dual_clip_c} A_i for A_i < 0"
        tex += rf"\ \text{{(dual clip }}c={a.dual_clip_c}\text{{)}}"
    if a.is_mode != "none":
        text += f" * w_IS[{a.is_mode}]"
        tex += r" \cdot w^{IS}"
    if a.beta > 0 and a.kl_placement == "loss":
        text += f" - {a.beta} KL_{a.kl_estimator.value}(pi_theta || pi_ref)"
        tex += rf" - {a.beta}\,\mathrm{{KL}}_{{{a.kl_estimator.value}}}"
    if a.entropy_coef:
        text += f" + {a.entropy_coef} H_it"
        tex += rf" + {a.entropy_coef} H_{{i,t}}"
    text += f" ],  A_i = {adv.replace('{eps}', str(a.adv_eps))}"
    tex += rf"\Big],\quad A_i = {adv_tex}"
    if a.beta > 0 and a.kl_placement == "reward":
        text += f",  R_i <- R_i - {a.beta} sum_t KL_{a.kl_estimator.value}"
        tex += rf",\quad R_i \leftarrow R_i - {a.beta}\sum_t \mathrm{{KL}}_{{{a.kl_estimator.value}}}"
    return text, tex


def _trl(cfg: Config) -> dict[str, Any]:
    a = cfg.algorithm
    loss_type = {"seq_mean_token_mean": "grpo", "token_mean": "dapo", "seq_mean_token_sum_norm": "dr_grpo", "seq_mean_token_sum": NONE}
    return {
        "loss_type": loss_type[a.aggregation.value],
        "scale_rewards": {"group_std": "group", "batch_std": "batch", "none": "none"}[a.scaling.value],
        "advantage baseline": "group mean" if a.baseline == "group_mean" else NONE + " (TRL's RLOOTrainer is separate)",
        "std": "sample (torch.std), eps 1e-4 fixed" + ("" if a.std_kind == "sample" else " -- differs: " + NONE),
        "epsilon / epsilon_high": f"{a.eps_low} / {a.eps_high}",
        "delta (two-sided clip)": a.dual_clip_c if a.surrogate == "dual_clip" else None,
        "importance_sampling_level": "sequence" if a.surrogate == "gspo" else "token",
        "beta": a.beta,
        "KL estimator": "k3 only, in loss" + ("" if (a.kl_estimator == "k3" and a.kl_placement == "loss") or a.beta == 0 else " -- differs: " + NONE),
        "mask_truncated_completions": a.mask_truncated,
        "vllm_importance_sampling_mode": a.is_mode.value if a.is_mode != "none" else None,
        "entropy bonus": NONE if a.entropy_coef else None,
        "num_iterations": cfg.train.mu,
        "num_generations": cfg.rollout.group_size,
    }


def _verl(cfg: Config) -> dict[str, Any]:
    a = cfg.algorithm
    kl_type = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}[a.kl_estimator.value]
    return {
        "algorithm.adv_estimator": "rloo" if a.baseline == "leave_one_out" else "grpo",
        "algorithm.norm_adv_by_std_in_grpo": a.scaling == "group_std" if a.scaling != "batch_std" else NONE + " (batch std)",
        "actor.loss_agg_mode": a.aggregation.value.replace("_", "-"),
        "actor.clip_ratio_low / clip_ratio_high": f"{a.eps_low} / {a.eps_high}",
        "actor.clip_ratio_c (dual clip)": a.dual_clip_c if a.surrogate == "dual_clip" else None,
        "actor.policy_loss.loss_mode": "gspo" if a.surrogate == "gspo" else "vanilla",
        "actor.use_kl_loss / kl_loss_coef / kl_loss_type": (a.beta > 0 and a.kl_placement == "loss", a.beta, kl_type),
        "algorithm.use_kl_in_reward / kl_penalty": (a.beta > 0 and a.kl_placement == "reward", kl_type),
        "actor.entropy_coeff": a.entropy_coef,
        "rollout importance sampling": a.is_mode.value,
        "actor.ppo_epochs": cfg.train.mu,
        "rollout.n": cfg.rollout.group_size,
    }


def _openrlhf(cfg: Config) -> dict[str, Any]:
    a = cfg.algorithm
    if a.baseline == "leave_one_out":
        est = "rloo"
    else:
        est = {"group_std": "group_norm", "none": "dr_grpo (only the no-std part of Dr. GRPO)", "batch_std": NONE}[a.scaling.value]
    return {
        "--advantage_estimator": est,
        "--eps_clip_low_high": f"{a.eps_low} {a.eps_high}",
        "--dual_clip": a.dual_clip_c if a.surrogate == "dual_clip" else None,
        "--use_kl_loss / --init_kl_coef / --kl_estimator": (a.kl_placement == "loss", a.beta, a.kl_estimator.value),
        "aggregation": "token mean" if a.aggregation == "token_mean" else NONE + f" for {a.aggregation.value}",
        "--policy_loss_type": "gspo" if a.surrogate == "gspo" else "ppo",
        "--n_samples_per_prompt": cfg.rollout.group_size,
    }


def objective_card(cfg: Config) -> dict[str, Any]:
    text, tex = formula(cfg)
    a = cfg.algorithm
    return {
        "preset": a.preset,
        "formula": text,
        "formula_latex": tex,
        "choices": {
            "baseline": a.baseline.value, "scaling": a.scaling.value, "std_kind": a.std_kind.value, "adv_eps": a.adv_eps,
            "surrogate": a.surrogate.value, "eps_low": a.eps_low, "eps_high": a.eps_high, "dual_clip_c": a.dual_clip_c,
            "aggregation": a.aggregation.value, "l_max": cfg.l_max, "beta": a.beta, "kl_estimator": a.kl_estimator.value,
            "kl_placement": a.kl_placement.value, "is_mode": a.is_mode.value, "is_c_max": a.is_c_max, "is_c_min": a.is_c_min,
            "entropy_coef": a.entropy_coef, "mask_truncated": a.mask_truncated, "overlong_buffer": a.overlong_buffer,
            "overlong_penalty": a.overlong_penalty, "dynamic_sampling": a.dynamic_sampling,
            "max_extra_rounds": a.max_extra_rounds, "mu": cfg.train.mu, "minibatches": cfg.train.minibatches,
            "group_size": cfg.rollout.group_size, "zero_variance_groups": "A = 0 exactly (max - min <= 1e-9)",
        },
        "equivalents": {"trl": _trl(cfg), "verl": _verl(cfg), "openrlhf": _openrlhf(cfg)},
    }
