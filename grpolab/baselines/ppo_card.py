"""The objective card of PPO with a critic (algorithm.estimator = gae): its formula and its peer equivalents.

grpolab/card.py calls ``formula`` and ``equivalents`` here when the estimator is gae; the surrogate, aggregation,
IS-correction, entropy and batch rows stay the card's own (the policy loss is the same code). Checked against the
peers' sources (versions in grpolab.card.PEER_VERSIONS):

- **TRL 1.16.0** has no PPOTrainer (it left the library before 1.0; neither trl.trainer nor trl.experimental holds
  one): every row is ``none``; the nearest TRL algorithm is RLOOTrainer (no critic).
- **verl 0.9.1**: ``algorithm.adv_estimator=gae`` runs ``compute_gae_advantage_return`` -- the same recursion,
  skipping masked tokens as grpolab does, always followed by ``masked_whiten`` with the *sample* variance;
  the KL in the reward is per token (``algorithm.use_kl_in_reward``); ``critic.cliprange_value`` clips the value.
- **OpenRLHF 0.11.2**: ``--algo.advantage.estimator gae`` with ``--algo.advantage.gamma`` / ``lambd``; its GAE
  zeroes masked values and rewards instead of skipping them (the same numbers for right-padded completions, not
  for masked tokens inside a completion); advantages are whitened with the population variance over the batch
  (``--algo.advantage.no_std_norm`` keeps only the centring); ``--critic.value_clip``.
"""

from __future__ import annotations

from typing import Any

from ..config import Config

EXACT, NEAREST, NONE = "exact", "nearest", "none"
_VERL_KL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
NO_PPO_IN_TRL = "TRL 1.16 has no PPOTrainer (the nearest is RLOOTrainer, without a critic)"


def _row(match: str, settings: dict[str, Any] | None = None, difference: str = "") -> dict[str, Any]:
    return {"match": match, "settings": settings or {}, **({"difference": difference} if difference else {})}


def formula(cfg: Config, loss: str, loss_tex: str) -> tuple[str, str]:
    """(plain text, LaTeX) of PPO's loss: `loss` / `loss_tex`, the policy loss as optimised (grpolab.card's
    ``policy_loss`` with per-token advantages A_it: the run's aggregation and surrogate), the GAE advantages, and
    the critic's loss."""
    a, c = cfg.algorithm, cfg.critic
    kl_r = a.beta > 0 and a.kl_placement == "reward"
    r_t = f"r_t = -{a.beta} KL_{a.kl_estimator.value}(t) + R [t = last]" if kl_r else "r_t = R [t = last]"
    r_tex = (
        rf"r_t = -{a.beta}\,\mathrm{{KL}}_{{{a.kl_estimator.value}}}(t) + R\,[t = T]" if kl_r else r"r_t = R\,[t = T]"
    )
    text = (
        f"{loss},  A_it = GAE(gamma={a.gamma}, lambda={a.lam}) of {r_t} with V_t from the critic, end terminal"
        + (", whitened over the batch" if a.whiten else "")
        + f";  critic: L_V = mean_tokens 0.5 max((V-G)^2, (V_old + clip(V-V_old, +-{c.value_clip}) - G)^2), G = A + V"
    )
    tex = (
        loss_tex
        + rf",\quad A_{{i,t}} = \sum_l (\gamma\lambda)^l \delta_{{t+l}},\ \delta_t = r_t + \gamma V_{{t+1}} - V_t,\ {r_tex}"
        + rf",\ \gamma={a.gamma},\ \lambda={a.lam}"
    )
    return text, tex


def choices(cfg: Config) -> dict[str, Any]:
    """The card's choices of the estimator fields, and the critic's for gae."""
    a, c = cfg.algorithm, cfg.critic
    fields = {"estimator": a.estimator, "gamma": a.gamma, "lam": a.lam, "whiten": a.whiten}
    if a.estimator != "gae":
        return fields
    return {
        **fields,
        "critic": {
            "backbone": "shared with the policy" if c.share_backbone else "copy of the policy's",
            "lr": c.lr,
            "value_clip": c.value_clip,
            "grad_clip": c.grad_clip,
            "kl": "per token in the reward"
            if a.beta > 0 and a.kl_placement == "reward"
            else ("in the loss" if a.beta > 0 else "none (beta = 0)"),
        },
    }


def _advantage(cfg: Config) -> dict[str, dict]:
    a, c = cfg.algorithm, cfg.critic
    verl_diff = ["sample variance (n - 1) in the whitening"] if a.whiten else ["always whitens the GAE advantages"]
    if c.share_backbone:
        verl_diff.append("the critic is always a separate model")
    verl = _row(
        NEAREST,
        {
            "algorithm.adv_estimator": "gae",
            "algorithm.gamma": a.gamma,
            "algorithm.lam": a.lam,
            "critic.cliprange_value": c.value_clip,
            "critic.optim.lr": c.lr,
        },
        "; ".join(verl_diff),
    )
    orl_diff = [
        "masked tokens inside a completion are zeroed, not skipped",
        "rsqrt(max(var, 1e-8)) instead of rsqrt(var + 1e-8)" if a.whiten else "always centres the advantages",
    ]
    if c.share_backbone:
        orl_diff.append("the critic is always a separate model")
    orl_settings: dict[str, Any] = {
        "--algo.advantage.estimator": "gae",
        "--algo.advantage.gamma": a.gamma,
        "--algo.advantage.lambd": a.lam,
        "--critic.value_clip": c.value_clip,
    }
    orl = _row(NEAREST, orl_settings, "; ".join(orl_diff))
    return {"trl": _row(NONE, {}, NO_PPO_IN_TRL), "verl": verl, "openrlhf": orl}


def _kl(cfg: Config, rows: dict[str, dict]) -> dict[str, dict]:
    """Per-token KL in the reward is what verl's use_kl_in_reward and OpenRLHF's init_coef do with gae."""
    a = cfg.algorithm
    if not (a.beta > 0 and a.kl_placement == "reward"):
        return {**rows, "trl": _row(NONE, {}, NO_PPO_IN_TRL)}
    clamp = ["k3 clamped to [-10, 10]"] if a.kl_estimator == "k3" else []
    verl = _row(
        NEAREST if clamp else EXACT,
        {
            "algorithm.use_kl_in_reward": True,
            "algorithm.kl_penalty": _VERL_KL[a.kl_estimator.value],
            "algorithm.kl_ctrl.type": "fixed",
            "algorithm.kl_ctrl.kl_coef": a.beta,
            "actor_rollout_ref.actor.use_kl_loss": False,
        },
        "; ".join(clamp),
    )
    orl = _row(EXACT, {"--algo.kl.init_coef": a.beta, "--algo.kl.estimator": a.kl_estimator.value})
    return {"trl": _row(NONE, {}, NO_PPO_IN_TRL), "verl": verl, "openrlhf": orl}


def equivalents(cfg: Config, rows: dict[str, dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """The card's per-axis rows with the advantage and KL axes replaced for gae, and every TRL row `none`."""
    out = {axis: dict(per_peer) for axis, per_peer in rows.items()}
    out["advantage"] = _advantage(cfg)
    out["kl"] = _kl(cfg, rows["kl"])
    for axis in out:
        out[axis]["trl"] = _row(NONE, {}, NO_PPO_IN_TRL)
    return out
