"""The objective as it is optimised, written out: the policy loss and the advantage as plain text and LaTeX."""

from __future__ import annotations

from typing import Any

from ..baselines import ppo_card
from ..config import Config
from ..training.reference import clears_optimizer

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
_ESTIMATOR_ADV = {  # estimators that replace baseline and scaling (grpolab/algo/advantages.py)
    "maxrl": (
        "(R_i - mean_g R) / mean_g R (0 where mean_g R <= 0)",
        r"\frac{R_i - \mathrm{mean}_g R}{\mathrm{mean}_g R}",
    ),
    "gdpo": (
        "(S_i - mean_batch S) / (std_batch S + {eps}), S_i = sum_k w_k (R^k_i - mean_g R^k) / (std_g R^k + {eps})",
        r"\frac{S_i - \mathrm{mean}_B S}{\mathrm{std}_B S + \epsilon},\ S_i = \sum_k w_k \frac{R^k_i - "
        r"\mathrm{mean}_g R^k}{\mathrm{std}_g R^k + \epsilon}",
    ),
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
    if a.surrogate in ("dppo_tv", "dppo_kl"):
        return _dppo_term(cfg, agg, agg_tex, adv, adv_tex)
    if a.surrogate == "clip_cov":
        pick = "the top" if a.clip_cov_select == "largest" else "a random"
        sel = f"{pick} {a.cov_ratio} of unclipped tokens with cov(A, log pi) in ({a.clip_cov_lb}, {a.clip_cov_ub})"
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


def _dppo_term(cfg: Config, agg: str, agg_tex: str, adv: str, adv_tex: str) -> tuple[str, str]:
    """(text, LaTeX) of dppo_tv / dppo_kl: the REINFORCE term with a capped detached ratio, dropped outside the
    divergence trust region of the sampled token's probability p (grpolab.algo.surrogate.dppo_kept)."""
    a = cfg.algorithm
    lo, hi, cap = a.dppo_low, a.dppo_high, a.dppo_ratio_cap
    if a.surrogate == "dppo_tv":
        out = f"{adv} > 0 and p - p_old > {hi}, or {adv} <= 0 and p - p_old < -{lo}"
        out_tex = rf"{adv_tex} > 0,\ p - p_{{old}} > {hi};\ {adv_tex} \le 0,\ p - p_{{old}} < -{lo}"
    else:
        d = "D_bin(p_old || p)"
        out = f"{adv} > 0, p > p_old and {d} > {hi}, or {adv} <= 0, p < p_old and {d} > {lo}"
        out_tex = (
            rf"{adv_tex} > 0,\ p > p_{{old}},\ D(p_{{old}} \| p) > {hi};\ {adv_tex} \le 0,\ p < p_{{old}},\ "
            rf"D(p_{{old}} \| p) > {lo}"
        )
    return (
        f"L = {agg} [ -sg(min(r_it, {cap})) {adv} log pi_theta(o_it) * (0 where {out})",
        rf"\mathcal{{L}} = {agg_tex}\Big[-\mathrm{{sg}}\big(\min(r_{{i,t}}, {cap})\big) {adv_tex} \log\pi_\theta(o_{{i,t}})"
        rf" \cdot \mathbb{{1}}\big[\neg({out_tex})\big]",
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
    # the ratio-clip forms are written L = -agg [ objective ... ], the others L = agg [ loss ...: the KL and entropy
    # terms take the sign of the bracket they are in
    plus, minus = (" - ", " + ") if text.startswith("L = -") else (" + ", " - ")
    plus_tex, minus_tex = (" - ", " + ") if tex.startswith(r"\mathcal{L} = -") else (" + ", " - ")
    if a.beta > 0 and a.kl_placement == "loss":
        weight, weight_tex = ("r_it ", r"r_{i,t}\,") if a.kl_bias_correction else ("", "")  # DeepSeek-V3.2's KL
        text += f"{plus}{a.beta} {weight}KL_{a.kl_estimator.value}(pi_theta || pi_ref)"
        tex += rf"{plus_tex}{a.beta}\,{weight_tex}\mathrm{{KL}}_{{{a.kl_estimator.value}}}"
    if a.entropy_coef:
        text += f"{minus}{a.entropy_coef} H_it"
        tex += rf"{minus_tex}{a.entropy_coef} H_{{i,t}}"
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
    if a.estimator == "pass_at_k":
        adv, adv_tex = _pass_at_k_text(a)
    else:
        adv, adv_tex = _ESTIMATOR_ADV.get(a.estimator) or _ADV_TEXT[(a.baseline.value, a.scaling.value)]
    adv = adv.replace("{eps}", str(a.adv_eps))
    if a.estimator == "distill":  # on-policy distillation: per-token advantages from the teacher (training/distill.py)
        w = cfg.distill.reward_weight
        text, tex = policy_loss(cfg, "A_it", "A_{i,t}")
        text += ",  A_it = log pi_T(o_it) - log pi_old(o_it)" + (f" + {w} A_i,  A_i = {adv}" if w else "")
        tex += r",\quad A_{i,t} = \log\pi_T(o_{i,t}) - \log\pi_{old}(o_{i,t})" + (
            rf" + {w} A_i,\quad A_i = {adv_tex}" if w else ""
        )
    else:
        text, tex = policy_loss(cfg)
        text += f",  A_i = {adv}"
        tex += rf",\quad A_i = {adv_tex}"
    if a.pi_old == "sampler":  # verl's bypass mode: the ratio and the trust region are taken against q itself
        text += ",  pi_old = q (the sampler's log-probabilities)"
        tex += r",\quad \pi_{old} = q"
    if a.beta > 0 and a.kl_placement == "reward":
        text += f",  R_i <- R_i - {a.beta} sum_t KL_{a.kl_estimator.value}"
        tex += rf",\quad R_i \leftarrow R_i - {a.beta}\sum_t \mathrm{{KL}}_{{{a.kl_estimator.value}}}"
    if a.beta > 0 and a.ref_reset_every:  # ProRL's periodic reference reset (training/reference.py)
        cleared = " (optimizer cleared, as ProRL)" if clears_optimizer(a) else " (optimizer kept)"
        text += f",  pi_ref <- pi_theta every {a.ref_reset_every} steps{cleared}"
        tex += rf",\quad \pi_{{ref}} \leftarrow \pi_\theta \text{{ every {a.ref_reset_every} steps{cleared}}}"
    return text, tex
