"""The objective card (grpolab.card): formula text / LaTeX per preset and the peer rows (names, values, verdicts).

These tests pin the card's own output by hand and need no peer installed; tests/test_card_peers.py feeds the same
rows to TRL, verl and OpenRLHF and compares numbers with their code.
"""

from __future__ import annotations

import json
import math

import pytest

from grpolab.card import (
    AXES,
    EXACT,
    NEAREST,
    NONE,
    OPENRLHF_NO_REWARD_CLIP,
    PEER_VERSIONS,
    VERL_NO_DUAL_CLIP,
    formula,
    objective_card,
    peer_settings,
)
from grpolab.config import from_dict

PRESETS = ["grpo", "dapo", "dr_grpo", "rloo", "gspo"]


def card(**algorithm):
    return objective_card(from_dict({"algorithm": algorithm}))


def cfg_card(raw):
    return objective_card(from_dict(raw))


# --------------------------------------------------------------------------------------------- formula text

# (aggregation text, advantage text, ratio text, must-contain extras, must-not-contain)
FORMULA = {
    "grpo": (
        "(1/B) sum_i (1/|o_i|) sum_t",
        "A_i = (R_i - mean_g R) / (std_g R + 1e-06)",
        "min(r_it A_i, clip(r_it, 1-0.2, 1+0.2) A_i)",
        ["- 0.04 KL_k3(pi_theta || pi_ref)"],
        [],
    ),
    "dapo": (
        "(1/sum_i |o_i|) sum_i sum_t",
        "A_i = (R_i - mean_g R) / (std_g R + 1e-06)",
        "clip(r_it, 1-0.2, 1+0.28)",
        [],
        ["KL"],
    ),
    "dr_grpo": ("(1/(B*64)) sum_i sum_t", "A_i = R_i - mean_g R", "clip(r_it, 1-0.2, 1+0.2)", [], ["KL", "std"]),
    "rloo": (
        "(1/B) sum_i (1/|o_i|) sum_t",
        "A_i = R_i - mean_{j!=i} R_j",
        "clip(r_it, 1-0.2, 1+0.2)",
        [],
        ["KL", "std"],
    ),
    "gspo": (
        "(1/B) sum_i (1/|o_i|) sum_t",
        "A_i = (R_i - mean_g R) / (std_g R + 1e-06)",
        "min(s_i = exp(mean_t log r_it) A_i, clip(s_i = exp(mean_t log r_it), 1-0.0003, 1+0.0004) A_i)",
        [],
        ["KL", "r_it A_i"],
    ),
}
LATEX = {
    "grpo": [
        r"\frac{1}{B}\sum_i \frac{1}{|o_i|}\sum_t",
        r"\frac{R_i - \mathrm{mean}_g R}{\mathrm{std}_g R + \epsilon}",
        r"r_{i,t}",
        r"- 0.04\,\mathrm{KL}_{k3}",
    ],
    "dapo": [r"\frac{1}{\sum_i |o_i|}\sum_i\sum_t", "1+0.28"],
    "dr_grpo": [r"\frac{1}{B \cdot L_{max}}\sum_i\sum_t", r"A_i = R_i - \mathrm{mean}_g R"],
    "rloo": [r"A_i = R_i - \mathrm{mean}_{j \ne i} R_j"],
    "gspo": [r"\min\big(s_i A_i", "1-0.0003", "1+0.0004"],
}


@pytest.mark.parametrize("preset", PRESETS)
def test_formula_text_has_the_right_aggregation_advantage_and_ratio(preset):
    c = card(preset=preset)
    agg, adv, ratio, extras, absent = FORMULA[preset]
    text = c["formula"]
    assert text.startswith(f"L = -{agg} [ ")
    assert text.endswith(adv)
    assert ratio in text
    for e in extras:
        assert e in text
    for a in absent:
        assert a not in text, (a, text)


@pytest.mark.parametrize("preset", PRESETS)
def test_formula_latex_is_present_and_matches(preset):
    tex = card(preset=preset)["formula_latex"]
    assert tex.startswith(r"\mathcal{L} = -")
    for piece in LATEX[preset]:
        assert piece in tex, (piece, tex)
    assert ("KL" in tex) == (preset == "grpo")


def test_every_preset_has_its_own_formula():
    texts = [card(preset=p)["formula"] for p in PRESETS]
    tex = [card(preset=p)["formula_latex"] for p in PRESETS]
    assert len(set(texts)) == len(PRESETS) and len(set(tex)) == len(PRESETS)


def test_formula_l_max_uses_the_explicit_constant():
    assert "(1/(B*512)) sum_i sum_t" in card(preset="dr_grpo", l_max=512)["formula"]
    raw = {"algorithm": {"preset": "dr_grpo"}, "rollout": {"max_new_tokens": 48}}
    assert "(1/(B*48)) sum_i sum_t" in cfg_card(raw)["formula"]
    assert cfg_card(raw)["choices"]["l_max"] == 48


def test_formula_optional_terms():
    text = card(surrogate="dual_clip", dual_clip_c=3.0)["formula"]
    assert ", capped at 3.0 A_i for A_i < 0" in text
    assert "* w_IS[token_truncate]" in card(is_mode="token_truncate")["formula"]
    assert "+ 0.01 H_it" in card(entropy_coef=0.01)["formula"]
    assert "A_i = (R_i - mean_batch R) / (std_batch R + 1e-06)" not in card(scaling="batch_std")["formula"]
    assert "A_i = (R_i - mean_g R) / (std_batch R + 1e-06)" in card(scaling="batch_std")["formula"]
    assert "A_i = (R_i - mean_{j!=i} R_j) / (std_g R + 1e-06)" in card(baseline="leave_one_out")["formula"]
    assert "(1/B) sum_i sum_t" in card(aggregation="seq_mean_token_sum")["formula"]
    assert "1e-08" in card(adv_eps=1e-8)["formula"]


def test_formula_kl_in_reward_moves_the_kl_term_to_the_reward():
    text = card(preset="grpo", kl_placement="reward", kl_estimator="k1")["formula"]
    assert "KL_k1(pi_theta || pi_ref)" not in text  # not in the loss
    assert text.endswith(",  R_i <- R_i - 0.04 sum_t KL_k1")


def test_formula_matches_the_formula_function():
    cfg = from_dict({"algorithm": {"preset": "dapo"}})
    assert (objective_card(cfg)["formula"], objective_card(cfg)["formula_latex"]) == formula(cfg)


# --------------------------------------------------------------------------------------------- choices


def test_choices_record_every_algorithm_field():
    from dataclasses import fields

    from grpolab.config import AlgorithmConfig

    c = card(preset="dapo")
    names = {f.name for f in fields(AlgorithmConfig)} - {"preset"}
    assert names <= set(c["choices"]), names - set(c["choices"])
    assert c["preset"] == "dapo"
    assert c["choices"]["aggregation"] == "token_mean" and c["choices"]["eps_high"] == 0.28
    assert c["choices"]["l_max"] == 64  # resolved constant (0 = max_new_tokens), not the raw 0
    json.dumps(c)  # stored in manifest.json as is


def test_std_kind_and_eps_are_recorded():
    a, b = card(std_kind="sample"), card(std_kind="population")
    assert a["choices"]["std_kind"] == "sample" and b["choices"]["std_kind"] == "population"
    assert a["choices"]["adv_eps"] == 1e-6


# --------------------------------------------------------------------------------------------- equivalents

A = "actor_rollout_ref.actor."


def eq_of(**algorithm):
    return card(**algorithm)["equivalents"]


def row(eq, peer, axis):
    return eq[peer][axis]


# preset -> peer -> axis -> (match, settings that must be among the row's settings)
EXPECTED_EQUIV = {
    "grpo": {
        "trl": {
            "advantage": (NEAREST, {"scale_rewards": "group"}),
            "surrogate": (
                EXACT,
                {"epsilon": 0.2, "epsilon_high": 0.2, "importance_sampling_level": "token", "delta": None},
            ),
            "aggregation": (EXACT, {"loss_type": "grpo"}),
            "kl": (EXACT, {"beta": 0.04, "use_bias_correction_kl": False}),
            "importance_sampling": (EXACT, {"vllm_importance_sampling_correction": False}),
            "batch": (EXACT, {"num_generations": 8, "num_iterations": 1, "max_completion_length": 64}),
        },
        "verl": {
            "advantage": (EXACT, {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True}),
            "surrogate": (
                EXACT,
                {
                    f"{A}policy_loss.loss_mode": "vanilla",
                    f"{A}clip_ratio_low": 0.2,
                    f"{A}clip_ratio_high": 0.2,
                    f"{A}clip_ratio_c": VERL_NO_DUAL_CLIP,
                },
            ),
            "aggregation": (EXACT, {f"{A}loss_agg_mode": "seq-mean-token-mean"}),
            "kl": (
                NEAREST,
                {
                    f"{A}use_kl_loss": True,
                    f"{A}kl_loss_coef": 0.04,
                    f"{A}kl_loss_type": "low_var_kl",
                    "algorithm.use_kl_in_reward": False,
                },
            ),
            "batch": (EXACT, {"actor_rollout_ref.rollout.n": 8, f"{A}ppo_epochs": 1, "data.train_batch_size": 4}),
        },
        "openrlhf": {
            "advantage": (NEAREST, {"--algo.advantage.estimator": "group_norm"}),
            "surrogate": (EXACT, {"--actor.eps_clip_low_high": [0.2, 0.2], "--actor.policy_loss_type": "ppo"}),
            "aggregation": (EXACT, {"--actor.loss_agg_mode": "seq-mean-token-mean"}),
            "kl": (NEAREST, {"--algo.kl.use_loss": True, "--algo.kl.init_coef": 0.04, "--algo.kl.estimator": "k3"}),
            "batch": (EXACT, {"--rollout.n_samples_per_prompt": 8, "--train.max_epochs": 1, "--rollout.batch_size": 4}),
        },
    },
    "dapo": {
        "trl": {
            "aggregation": (EXACT, {"loss_type": "dapo"}),
            "surrogate": (EXACT, {"epsilon_high": 0.28}),
            "kl": (EXACT, {"beta": 0.0}),
            "dynamic_sampling": (NONE, {}),
            "overlong": (EXACT, {}),
        },
        "verl": {
            "aggregation": (EXACT, {f"{A}loss_agg_mode": "token-mean"}),
            "surrogate": (EXACT, {f"{A}clip_ratio_high": 0.28}),
            "kl": (EXACT, {f"{A}use_kl_loss": False, "algorithm.use_kl_in_reward": False}),
            "dynamic_sampling": (
                NEAREST,
                {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "reward"},
            ),
            "overlong": (
                EXACT,
                {
                    "reward.reward_manager.name": "dapo",
                    "+reward.reward_kwargs.overlong_buffer_cfg.enable": True,
                    "+reward.reward_kwargs.overlong_buffer_cfg.len": 16,
                    "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0,
                    "+reward.reward_kwargs.max_resp_len": 64,
                },
            ),
        },
        "openrlhf": {
            "aggregation": (EXACT, {"--actor.loss_agg_mode": "token-mean"}),
            "surrogate": (EXACT, {"--actor.eps_clip_low_high": [0.2, 0.28]}),
            "kl": (EXACT, {"--algo.kl.init_coef": 0.0}),
            "dynamic_sampling": (NEAREST, {"--algo.dynamic_filtering_enable": True}),
            "overlong": (EXACT, {"--reward.overlong_buffer_len": 16, "--reward.overlong_penalty_factor": 1.0}),
        },
    },
    "dr_grpo": {
        "trl": {"advantage": (EXACT, {"scale_rewards": "none"}), "aggregation": (EXACT, {"loss_type": "dr_grpo"})},
        "verl": {
            "advantage": (EXACT, {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False}),
            "aggregation": (EXACT, {f"{A}loss_agg_mode": "seq-mean-token-sum-norm", f"{A}loss_scale_factor": 64}),
        },
        "openrlhf": {"advantage": (EXACT, {"--algo.advantage.estimator": "dr_grpo"}), "aggregation": (NONE, {})},
    },
    "rloo": {
        "trl": {
            "advantage": (EXACT, {"normalize_advantages": False}),
            "surrogate": (NEAREST, {"epsilon": 0.2}),
            "aggregation": (NEAREST, {}),
            "kl": (EXACT, {"beta": 0.0}),
        },
        "verl": {"advantage": (EXACT, {"algorithm.adv_estimator": "rloo"})},
        "openrlhf": {"advantage": (EXACT, {"--algo.advantage.estimator": "rloo"})},
    },
    "gspo": {
        "trl": {
            "surrogate": (EXACT, {"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}),
            "aggregation": (EXACT, {"loss_type": "grpo"}),
        },
        "verl": {
            "surrogate": (
                EXACT,
                {f"{A}policy_loss.loss_mode": "gspo", f"{A}clip_ratio_low": 3e-4, f"{A}clip_ratio_high": 4e-4},
            ),
            "aggregation": (EXACT, {f"{A}loss_agg_mode": "seq-mean-token-mean"}),
        },
        "openrlhf": {
            "surrogate": (EXACT, {"--actor.policy_loss_type": "gspo", "--actor.eps_clip_low_high": [3e-4, 4e-4]}),
            "aggregation": (EXACT, {"--actor.loss_agg_mode": "seq-mean-token-mean"}),
        },
    },
}


@pytest.mark.parametrize("preset", PRESETS)
def test_equivalents_per_preset(preset):
    eq = eq_of(preset=preset)
    assert set(eq) == set(PEER_VERSIONS)
    assert eq["trl"]["interface"] == ("trl.RLOOConfig" if preset == "rloo" else "trl.GRPOConfig")
    for peer, axes in EXPECTED_EQUIV[preset].items():
        for axis, (match, settings) in axes.items():
            got = row(eq, peer, axis)
            assert got["match"] == match, (peer, axis, got)
            for key, value in settings.items():
                assert got["settings"].get(key, "<absent>") == value, (peer, axis, key, got["settings"])


VARIATIONS = [
    {},
    {"scaling": "batch_std"},
    {"baseline": "leave_one_out", "scaling": "group_std"},
    {"std_kind": "population"},
    {"surrogate": "dual_clip"},
    {"aggregation": "seq_mean_token_sum"},
    {"beta": 0.05, "kl_placement": "reward"},
    {"is_mode": "sequence_mask"},
    {"entropy_coef": 0.01},
    {"mask_truncated": True},
    {"dynamic_sampling": True},
    {"preset": "rloo", "beta": 0.1, "kl_placement": "loss", "is_mode": "token_mask", "entropy_coef": 0.1},
]


@pytest.mark.parametrize("algorithm", [{"preset": p} for p in PRESETS] + VARIATIONS)
def test_every_row_names_the_version_and_a_verdict(algorithm):
    eq = eq_of(**algorithm)
    for peer, version in PEER_VERSIONS.items():
        assert eq[peer]["checked_against"] == f"{peer} {version}"
        for axis in AXES:
            r = row(eq, peer, axis)
            assert r["match"] in (EXACT, NEAREST, NONE), (peer, axis)
            assert (r["match"] != EXACT) == bool(r.get("difference")), (peer, axis, r)  # a difference iff not exact
            assert r["match"] != NONE or r["settings"] == {}, (peer, axis)
        peer_settings(eq[peer])  # merges without conflicts
        if peer == "openrlhf":  # 0.10.2 renamed every flag to a dotted name, with no aliases
            assert all(k.startswith("--") and "." in k for k in peer_settings(eq[peer])), peer_settings(eq[peer])


def test_peer_settings_rejects_two_rows_setting_one_key_differently():
    eq = eq_of()["trl"]
    merged = peer_settings(eq)
    assert merged["loss_type"] == "grpo" and merged["scale_rewards"] == "group" and merged["beta"] == 0.04
    eq["kl"]["settings"]["loss_type"] = "dapo"
    with pytest.raises(ValueError, match="loss_type"):
        peer_settings(eq)


@pytest.mark.parametrize(
    "aggregation, trl, verl, openrlhf",
    [
        ("seq_mean_token_mean", "grpo", "seq-mean-token-mean", "seq-mean-token-mean"),
        ("token_mean", "dapo", "token-mean", "token-mean"),
        ("seq_mean_token_sum_norm", "dr_grpo", "seq-mean-token-sum-norm", None),
        ("seq_mean_token_sum", "luspo", "seq-mean-token-sum", None),
    ],
)
def test_aggregation_names(aggregation, trl, verl, openrlhf):
    eq = eq_of(aggregation=aggregation)
    assert row(eq, "trl", "aggregation") == {"match": EXACT, "settings": {"loss_type": trl}}
    assert row(eq, "verl", "aggregation")["settings"][f"{A}loss_agg_mode"] == verl
    orl = row(eq, "openrlhf", "aggregation")
    assert orl["settings"].get("--actor.loss_agg_mode") == openrlhf and (orl["match"] == NONE) == (openrlhf is None)


def test_aggregation_differences():
    assert (
        row(eq_of(preset="gspo", aggregation="token_mean"), "openrlhf", "aggregation")["match"] == NONE
    )  # GSPO: seq-mean only
    assert (
        row(eq_of(preset="dr_grpo", l_max=16), "trl", "aggregation")["match"] == NEAREST
    )  # constant = max_completion_length
    assert row(eq_of(preset="dr_grpo", l_max=16), "verl", "aggregation")["settings"][f"{A}loss_scale_factor"] == 16
    two_steps = cfg_card({"algorithm": {"preset": "dapo"}, "train": {"minibatches": 2}})["equivalents"]
    assert row(two_steps, "trl", "aggregation")["match"] == NEAREST


@pytest.mark.parametrize(
    "estimator, verl, trl_match, verl_match",
    [("k1", "kl", NEAREST, EXACT), ("k2", "mse", NEAREST, EXACT), ("k3", "low_var_kl", EXACT, NEAREST)],
)
def test_kl_in_loss(estimator, verl, trl_match, verl_match):
    eq = eq_of(beta=0.05, kl_estimator=estimator)
    assert row(eq, "trl", "kl") == {
        "match": trl_match,
        "settings": {"beta": 0.05, "use_bias_correction_kl": False},
        **({"difference": "k3 only"} if trl_match == NEAREST else {}),
    }
    v = row(eq, "verl", "kl")
    assert (
        v["match"] == verl_match
        and v["settings"][f"{A}kl_loss_type"] == verl
        and v["settings"][f"{A}kl_loss_coef"] == 0.05
    )
    o = row(eq, "openrlhf", "kl")
    assert o["match"] == NEAREST
    assert o["settings"] == {"--algo.kl.use_loss": True, "--algo.kl.init_coef": 0.05, "--algo.kl.estimator": estimator}
    assert "token-mean" in o["difference"]  # seq_mean_token_mean here; OpenRLHF's KL term is always a token mean
    assert "token-mean" not in row(eq_of(beta=0.05, aggregation="token_mean"), "openrlhf", "kl")["difference"]


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_reward(estimator):
    eq = eq_of(beta=0.05, kl_placement="reward", kl_estimator=estimator)
    assert row(eq, "trl", "kl")["match"] == NONE  # GRPOTrainer: KL only in the loss
    v = row(eq, "verl", "kl")
    penalty = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}[estimator]
    assert v["settings"] == {
        "algorithm.use_kl_in_reward": True,
        "algorithm.kl_penalty": penalty,
        "algorithm.kl_ctrl.type": "fixed",
        "algorithm.kl_ctrl.kl_coef": 0.05,
        f"{A}use_kl_loss": False,
    }
    o = row(eq, "openrlhf", "kl")
    assert o["match"] == NEAREST and "--algo.kl.use_loss" not in o["settings"] and "reward-to-go" in o["difference"]
    rloo = eq_of(preset="rloo", beta=0.05, kl_placement="reward", kl_estimator=estimator)
    assert row(rloo, "trl", "kl") == {
        "match": EXACT if estimator == "k1" else NEAREST,
        "settings": {"beta": 0.05},
        **({} if estimator == "k1" else {"difference": "k1 only"}),
    }
    assert row(eq_of(preset="rloo", beta=0.05), "trl", "kl")["match"] == NONE  # RLOOTrainer: KL only in the reward


def test_beta_zero_switches_openrlhf_kl_off():
    assert row(eq_of(beta=0.0), "openrlhf", "kl")["settings"] == {
        "--algo.kl.init_coef": 0.0
    }  # its default 0.01 is KL in reward


def test_advantage_scaling_and_std():
    eq = eq_of(scaling="batch_std")
    assert row(eq, "trl", "advantage")["settings"] == {"scale_rewards": "batch"}
    whiten = "group mean, then token-level whitening over the batch (re-centred, population std)"
    assert row(eq, "verl", "advantage") == {
        "match": NEAREST,
        "difference": whiten,
        "settings": {"algorithm.adv_estimator": "reinforce_plus_plus_baseline"},
    }
    assert row(eq, "openrlhf", "advantage")["settings"]["--algo.advantage.estimator"] == "reinforce_baseline"
    pop = eq_of(std_kind="population")
    assert all("sample std (n - 1)" in row(pop, p, "advantage")["difference"] for p in PEER_VERSIONS)
    assert row(eq_of(adv_eps=1e-4), "trl", "advantage")["match"] == EXACT  # TRL's fixed epsilon
    assert row(eq_of(), "trl", "advantage")["difference"] == "divides by std + 1e-4 (fixed)"
    assert row(eq_of(), "openrlhf", "advantage")["settings"]["--reward.clip_range"] == OPENRLHF_NO_REWARD_CLIP
    loo = eq_of(baseline="leave_one_out", scaling="group_std")
    assert [row(loo, p, "advantage")["match"] for p in PEER_VERSIONS] == [NEAREST] * 3


def test_dual_clip_and_plain_clip():
    eq = eq_of(surrogate="dual_clip", dual_clip_c=2.5)
    assert row(eq, "trl", "surrogate") == {
        "match": EXACT,
        "settings": {"epsilon": 0.2, "epsilon_high": 0.2, "importance_sampling_level": "token", "delta": 2.5},
    }
    assert row(eq, "verl", "surrogate")["settings"][f"{A}clip_ratio_c"] == 2.5
    assert row(eq, "openrlhf", "surrogate")["settings"]["--actor.dual_clip"] == 2.5
    assert (
        row(eq_of(surrogate="dual_clip", dual_clip_c=1.1), "trl", "surrogate")["match"] == NEAREST
    )  # delta <= 1 + eps_high
    plain = eq_of()
    assert VERL_NO_DUAL_CLIP > math.exp(20)  # verl's largest ratio: the dual clip of its vanilla loss never binds
    assert row(plain, "verl", "surrogate")["settings"][f"{A}clip_ratio_c"] == VERL_NO_DUAL_CLIP
    assert "--actor.dual_clip" not in row(plain, "openrlhf", "surrogate")["settings"]


IS_FLAG = "--algo.advantage.is_correction_"
IS_MASK = {f"{IS_FLAG}mode": "mask", f"{IS_FLAG}threshold": [0.8, 1.25]}


@pytest.mark.parametrize(
    "mode, verl_threshold, openrlhf",
    [
        (
            "token_truncate",
            1.25,
            (EXACT, {f"{IS_FLAG}level": "token", f"{IS_FLAG}mode": "clip", f"{IS_FLAG}threshold": [0.0, 1.25]}),
        ),
        ("token_mask", "0.8_1.25", (EXACT, {f"{IS_FLAG}level": "token", **IS_MASK})),
        ("sequence_truncate", 1.25, (NONE, {})),
        (  # masked above C only: verl's lower bound is below any weight it produces, TRL's clip_min None
            "sequence_mask",
            "1e-30_1.25",
            (NEAREST, {f"{IS_FLAG}level": "seq", f"{IS_FLAG}mode": "mask", f"{IS_FLAG}threshold": [0.0, 1.25]}),
        ),
    ],
)
def test_importance_sampling(mode, verl_threshold, openrlhf):
    eq = eq_of(is_mode=mode, is_c_min=0.8, is_c_max=1.25)
    clip_min = 0.8 if mode == "token_mask" else None
    assert row(eq, "trl", "importance_sampling") == {
        "match": EXACT,
        "settings": {
            "use_vllm": True,
            "vllm_importance_sampling_correction": True,
            "vllm_importance_sampling_mode": mode,
            "vllm_importance_sampling_clip_max": 1.25,
            "vllm_importance_sampling_clip_min": clip_min,
        },
    }
    assert row(eq, "verl", "importance_sampling")["settings"] == {
        "algorithm.rollout_correction.rollout_is": mode.split("_")[0],
        "algorithm.rollout_correction.rollout_is_threshold": verl_threshold,
    }
    o = row(eq, "openrlhf", "importance_sampling")
    assert (o["match"], o["settings"]) == openrlhf
    assert row(eq_of(preset="gspo", is_mode=mode), "openrlhf", "importance_sampling")["match"] == NONE
    assert row(eq_of(preset="rloo", is_mode=mode), "trl", "importance_sampling")["match"] == NONE


def test_entropy_mask_truncated_overlong_dynamic_and_batch():
    algorithm = {
        "entropy_coef": 0.01,
        "mask_truncated": True,
        "overlong_buffer": 8,
        "overlong_penalty": 0.5,
        "dynamic_sampling": True,
    }
    eq = cfg_card({"algorithm": algorithm, "train": {"mu": 2, "minibatches": 2}, "rollout": {"group_size": 4}})[
        "equivalents"
    ]
    assert row(eq, "trl", "entropy") == {
        "match": NEAREST,
        "settings": {"entropy_coef": 0.01},
        "difference": "the bonus is the token mean of each micro-batch, whatever loss_type",
    }
    assert row(eq, "verl", "entropy") == {"match": EXACT, "settings": {f"{A}entropy_coeff": 0.01}}
    assert (
        row(eq, "openrlhf", "entropy")["match"] == NEAREST
    )  # seq_mean_token_mean: OpenRLHF's entropy term is a token mean
    assert row(eq_of(entropy_coef=0.01, aggregation="token_mean"), "openrlhf", "entropy")["match"] == EXACT
    assert [row(eq, p, "mask_truncated")["match"] for p in PEER_VERSIONS] == [EXACT, NONE, NONE]
    assert row(eq, "trl", "overlong")["reward_function"] == (
        "trl.rewards.get_soft_overlong_punishment(max_completion_len=64, soft_punish_cache=8) with reward weight 0.5"
    )
    assert row(eq, "openrlhf", "overlong")["settings"] == {
        "--reward.overlong_buffer_len": 8,
        "--reward.overlong_penalty_factor": 0.5,
    }
    assert [row(eq, p, "dynamic_sampling")["match"] for p in PEER_VERSIONS] == [NONE, NEAREST, NEAREST]
    assert row(eq, "trl", "batch")["settings"] == {
        "num_generations": 4,
        "num_iterations": 2,
        "max_completion_length": 64,
        "generation_batch_size": 16,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
    }
    assert row(eq, "verl", "batch")["settings"] == {
        "data.train_batch_size": 4,
        "data.max_response_length": 64,
        f"{A}ppo_mini_batch_size": 2,
        f"{A}ppo_epochs": 2,
        "actor_rollout_ref.rollout.n": 4,
    }
    assert row(eq, "openrlhf", "batch")["settings"] == {
        "--rollout.batch_size": 4,
        "--rollout.n_samples_per_prompt": 4,
        "--rollout.max_new_tokens": 64,
        "--train.batch_size": 8,
        "--train.max_epochs": 2,
    }


# --------------------------------------------------------------------------------------------- once-bugs (regressions)


def test_openrlhf_gspo_equivalent():
    assert row(eq_of(preset="gspo"), "openrlhf", "surrogate")["settings"]["--actor.policy_loss_type"] == "gspo"
    assert row(eq_of(preset="grpo"), "openrlhf", "surrogate")["settings"]["--actor.policy_loss_type"] == "ppo"


def test_latex_shows_kl_in_reward():
    with_kl = card(preset="grpo", kl_placement="reward")["formula_latex"]
    without = card(preset="grpo", beta=0.0)["formula_latex"]
    assert with_kl != without
    assert "0.04" in with_kl


# --------------------------------------------------------------------------------------------- docs/algorithms.md

REGISTRIES = [
    ("grpolab.algo.advantages", "BASELINES", "Baseline"),
    ("grpolab.algo.advantages", "SCALINGS", "Scaling"),
    ("grpolab.algo.surrogate", "SURROGATES", "Surrogate"),
    ("grpolab.algo.aggregation", "AGGREGATIONS", "Aggregation"),
    ("grpolab.algo.kl", "KL_ESTIMATORS", "KLEstimator"),
    ("grpolab.algo.importance", "IS_CORRECTIONS", "ISMode"),
]


@pytest.mark.parametrize("module, registry, enum", REGISTRIES)
def test_every_registry_is_complete_and_documented(module, registry, enum):
    import importlib
    from pathlib import Path

    mod = importlib.import_module(module)
    reg, en = getattr(mod, registry), getattr(mod, enum)
    assert set(reg) == set(en)  # every enum value dispatches somewhere
    doc = (Path(__file__).resolve().parents[1] / "docs" / "algorithms.md").read_text()
    assert f"`{registry}`" in doc and f"`{enum}`" in doc
    for value in en:
        assert f"`{value.value}`" in doc, value


def test_docs_list_every_preset_and_kl_placement():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "algorithms.md").read_text()
    for p in PRESETS:
        assert f"`{p}`" in doc
    assert "`KLPlacement`" in doc and "`loss`" in doc and "`reward`" in doc


def _doc_value(text: str):
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def test_docs_preset_table_matches_the_presets():
    """Every cell of the presets table in docs/algorithms.md, and its list of common values, equals the expansion."""
    import re
    from pathlib import Path

    from grpolab.config import to_dict

    doc = (Path(__file__).resolve().parents[1] / "docs" / "algorithms.md").read_text()
    section = doc.split("## Presets", 1)[1].split("## Peer equivalents", 1)[0]
    expanded = {p: to_dict(from_dict({"algorithm": {"preset": p}}))["algorithm"] for p in PRESETS}
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip().split(" ")[0].strip("`") for c in lines[0].strip("|").split("|")]
    assert header[1:] == PRESETS
    checked = set()
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = [n.strip() for n in cells[0].split("/")]
        for preset, cell in zip(PRESETS, cells[1:]):
            values = [v.strip() for v in cell.split(" / ")]
            assert len(values) == len(names), line
            for name, value in zip(names, values):
                assert expanded[preset][name] == _doc_value(value), (preset, name, value)
                checked.add(name)
    common = re.findall(r"`(\w+): ([^`]+)`", section.split("Common to all presets:", 1)[1].split("\n\n", 1)[0])
    for name, value in common:
        for preset in PRESETS:
            assert expanded[preset][name] == _doc_value(value), (preset, name, value)
        checked.add(name)
    assert checked == set(expanded["grpo"]) - {"preset"}  # every field is documented, in the table or as common


def test_docs_peer_section_names_the_checked_versions_and_the_check():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "algorithms.md").read_text()
    section = doc.split("## Peer equivalents", 1)[1]
    for peer, version in PEER_VERSIONS.items():
        assert version in section, peer
    for axis in AXES:
        assert f"`{axis}`" in section, axis
    assert "tests/test_card_peers.py" in section and "xfail" not in doc and "Known gaps" not in doc
