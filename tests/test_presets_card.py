"""The objective card (grpolab.card): formula text / LaTeX per preset and the nearest peer settings.

Peer option names and values were checked against the peers' own sources:
- TRL GRPOConfig: loss_type in {"grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo"}; scale_rewards in
  {"group", "batch", "none"} (+ booleans); advantages / (torch.std + 1e-4); importance_sampling_level in
  {"token", "sequence"}; delta (two-sided clip); vllm_importance_sampling_mode in {"token_truncate", "token_mask",
  "sequence_truncate", "sequence_mask"}; mask_truncated_completions; num_iterations; num_generations.
- verl: actor.loss_agg_mode in {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
  "seq-mean-token-sum-norm"}; kl_loss_type / kl_penalty in {"kl"/"k1", "abs", "mse"/"k2", "low_var_kl"/"k3",
  "full"}; algorithm.adv_estimator "grpo" / "rloo"; norm_adv_by_std_in_grpo; clip_ratio_c; policy_loss.loss_mode
  "vanilla" / "gspo".
- OpenRLHF train_ppo_ray.py: --advantage_estimator in {gae, reinforce, rloo, reinforce_baseline, group_norm,
  dr_grpo}; --eps_clip_low_high; --dual_clip; --use_kl_loss; --init_kl_coef; --kl_estimator in {k1, k2, k3};
  --policy_loss_type in {ppo, gspo}; --n_samples_per_prompt.
"""

from __future__ import annotations

import json

import pytest

from grpolab.card import NONE, formula, objective_card
from grpolab.config import from_dict

PRESETS = ["grpo", "dapo", "dr_grpo", "rloo", "gspo"]


def card(**algorithm):
    return objective_card(from_dict({"algorithm": algorithm}))


def cfg_card(raw):
    return objective_card(from_dict(raw))


# --------------------------------------------------------------------------------------------- formula text

# (aggregation text, advantage text, ratio text, must-contain extras, must-not-contain)
FORMULA = {
    "grpo": ("(1/B) sum_i (1/|o_i|) sum_t", "A_i = (R_i - mean_g R) / (std_g R + 1e-06)", "min(r_it A_i, clip(r_it, 1-0.2, 1+0.2) A_i)",
             ["- 0.04 KL_k3(pi_theta || pi_ref)"], []),
    "dapo": ("(1/sum_i |o_i|) sum_i sum_t", "A_i = (R_i - mean_g R) / (std_g R + 1e-06)", "clip(r_it, 1-0.2, 1+0.28)",
             [], ["KL"]),
    "dr_grpo": ("(1/(B*64)) sum_i sum_t", "A_i = R_i - mean_g R", "clip(r_it, 1-0.2, 1+0.2)", [], ["KL", "std"]),
    "rloo": ("(1/B) sum_i (1/|o_i|) sum_t", "A_i = R_i - mean_{j!=i} R_j", "clip(r_it, 1-0.2, 1+0.2)", [], ["KL", "std"]),
    "gspo": ("(1/B) sum_i (1/|o_i|) sum_t", "A_i = (R_i - mean_g R) / (std_g R + 1e-06)",
             "min(s_i = exp(mean_t log r_it) A_i, clip(s_i = exp(mean_t log r_it), 1-0.0003, 1+0.0004) A_i)", [], ["KL", "r_it A_i"]),
}
LATEX = {
    "grpo": [r"\frac{1}{B}\sum_i \frac{1}{|o_i|}\sum_t", r"\frac{R_i - \mathrm{mean}_g R}{\mathrm{std}_g R + \epsilon}", r"r_{i,t}", r"- 0.04\,\mathrm{KL}_{k3}"],
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

EXPECTED_EQUIV = {
    "grpo": {
        "trl": {"loss_type": "grpo", "scale_rewards": "group", "advantage baseline": "group mean", "beta": 0.04,
                "epsilon / epsilon_high": "0.2 / 0.2", "importance_sampling_level": "token", "KL estimator": "k3 only, in loss",
                "delta (two-sided clip)": None, "num_iterations": 1, "num_generations": 8},
        "verl": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True,
                 "actor.loss_agg_mode": "seq-mean-token-mean", "actor.clip_ratio_low / clip_ratio_high": "0.2 / 0.2",
                 "actor.policy_loss.loss_mode": "vanilla",
                 "actor.use_kl_loss / kl_loss_coef / kl_loss_type": (True, 0.04, "low_var_kl"),
                 "algorithm.use_kl_in_reward / kl_penalty": (False, "low_var_kl"), "rollout.n": 8},
        "openrlhf": {"--advantage_estimator": "group_norm", "--eps_clip_low_high": "0.2 0.2",
                     "--use_kl_loss / --init_kl_coef / --kl_estimator": (True, 0.04, "k3"), "--n_samples_per_prompt": 8},
    },
    "dapo": {
        "trl": {"loss_type": "dapo", "scale_rewards": "group", "epsilon / epsilon_high": "0.2 / 0.28", "beta": 0.0,
                "importance_sampling_level": "token"},
        "verl": {"algorithm.adv_estimator": "grpo", "actor.loss_agg_mode": "token-mean",
                 "actor.clip_ratio_low / clip_ratio_high": "0.2 / 0.28",
                 "actor.use_kl_loss / kl_loss_coef / kl_loss_type": (False, 0.0, "low_var_kl")},
        "openrlhf": {"--advantage_estimator": "group_norm", "--eps_clip_low_high": "0.2 0.28", "aggregation": "token mean"},
    },
    "dr_grpo": {
        "trl": {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0},
        "verl": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False,
                 "actor.loss_agg_mode": "seq-mean-token-sum-norm"},
        "openrlhf": {"--advantage_estimator": "dr_grpo (only the no-std part of Dr. GRPO)"},
    },
    "rloo": {
        "trl": {"loss_type": "grpo", "scale_rewards": "none", "advantage baseline": f"{NONE} (TRL's RLOOTrainer is separate)"},
        "verl": {"algorithm.adv_estimator": "rloo", "algorithm.norm_adv_by_std_in_grpo": False},
        "openrlhf": {"--advantage_estimator": "rloo"},
    },
    "gspo": {
        "trl": {"importance_sampling_level": "sequence", "epsilon / epsilon_high": "0.0003 / 0.0004", "loss_type": "grpo"},
        "verl": {"actor.policy_loss.loss_mode": "gspo", "actor.clip_ratio_low / clip_ratio_high": "0.0003 / 0.0004",
                 "actor.loss_agg_mode": "seq-mean-token-mean"},
        "openrlhf": {"--eps_clip_low_high": "0.0003 0.0004"},
    },
}


@pytest.mark.parametrize("preset", PRESETS)
def test_equivalents_per_preset(preset):
    eq = card(preset=preset)["equivalents"]
    assert set(eq) == {"trl", "verl", "openrlhf"}
    for peer, expected in EXPECTED_EQUIV[preset].items():
        for key, value in expected.items():
            assert key in eq[peer], (peer, key)
            assert eq[peer][key] == value, (peer, key, eq[peer][key], value)


def test_openrlhf_dr_grpo_says_it_is_only_the_no_std_part():
    assert card(preset="dr_grpo")["equivalents"]["openrlhf"]["--advantage_estimator"].startswith("dr_grpo (only the no-std part")


@pytest.mark.parametrize("aggregation, trl, verl", [
    ("seq_mean_token_mean", "grpo", "seq-mean-token-mean"),
    ("token_mean", "dapo", "token-mean"),
    ("seq_mean_token_sum_norm", "dr_grpo", "seq-mean-token-sum-norm"),
    ("seq_mean_token_sum", NONE, "seq-mean-token-sum"),
])
def test_aggregation_names(aggregation, trl, verl):
    eq = card(aggregation=aggregation)["equivalents"]
    assert eq["trl"]["loss_type"] == trl
    assert eq["verl"]["actor.loss_agg_mode"] == verl
    openrlhf = eq["openrlhf"]["aggregation"]
    assert openrlhf == "token mean" if aggregation == "token_mean" else openrlhf.startswith(NONE)


@pytest.mark.parametrize("estimator, verl", [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")])
def test_kl_estimator_names(estimator, verl):
    eq = card(beta=0.05, kl_estimator=estimator)["equivalents"]
    assert eq["verl"]["actor.use_kl_loss / kl_loss_coef / kl_loss_type"] == (True, 0.05, verl)
    assert eq["openrlhf"]["--use_kl_loss / --init_kl_coef / --kl_estimator"] == (True, 0.05, estimator)
    trl = eq["trl"]["KL estimator"]
    assert trl == "k3 only, in loss" if estimator == "k3" else trl.endswith("differs: " + NONE)


def test_kl_in_reward_maps_to_verl_use_kl_in_reward():
    eq = card(beta=0.05, kl_placement="reward", kl_estimator="k1")["equivalents"]
    assert eq["verl"]["algorithm.use_kl_in_reward / kl_penalty"] == (True, "kl")
    assert eq["verl"]["actor.use_kl_loss / kl_loss_coef / kl_loss_type"][0] is False
    assert eq["openrlhf"]["--use_kl_loss / --init_kl_coef / --kl_estimator"][0] is False  # OpenRLHF: KL in reward
    assert eq["trl"]["KL estimator"].endswith("differs: " + NONE)


def test_batch_std_has_no_equivalent_in_verl_or_openrlhf_but_is_trl_batch():
    eq = card(scaling="batch_std")["equivalents"]
    assert eq["trl"]["scale_rewards"] == "batch"
    assert eq["verl"]["algorithm.norm_adv_by_std_in_grpo"].startswith(NONE)
    assert eq["openrlhf"]["--advantage_estimator"] == NONE


def test_population_std_differs_from_trl():
    assert card(std_kind="population")["equivalents"]["trl"]["std"].endswith("differs: " + NONE)
    assert card(std_kind="sample")["equivalents"]["trl"]["std"] == "sample (torch.std), eps 1e-4 fixed"


def test_dual_clip_maps_to_every_peer():
    eq = card(surrogate="dual_clip", dual_clip_c=2.5)["equivalents"]
    assert eq["trl"]["delta (two-sided clip)"] == 2.5
    assert eq["verl"]["actor.clip_ratio_c (dual clip)"] == 2.5
    assert eq["openrlhf"]["--dual_clip"] == 2.5
    plain = card()["equivalents"]
    assert plain["trl"]["delta (two-sided clip)"] is None and plain["openrlhf"]["--dual_clip"] is None


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_is_mode_uses_trl_names(mode):
    eq = card(is_mode=mode)["equivalents"]
    assert eq["trl"]["vllm_importance_sampling_mode"] == mode
    assert card()["equivalents"]["trl"]["vllm_importance_sampling_mode"] is None


def test_entropy_bonus_and_iterations():
    eq = cfg_card({"algorithm": {"entropy_coef": 0.01}, "train": {"mu": 2, "minibatches": 2}, "rollout": {"group_size": 4}})["equivalents"]
    assert eq["trl"]["entropy bonus"] == NONE
    assert eq["verl"]["actor.entropy_coeff"] == 0.01
    assert eq["trl"]["num_iterations"] == 2 and eq["verl"]["actor.ppo_epochs"] == 2
    assert eq["trl"]["num_generations"] == 4 and eq["verl"]["rollout.n"] == 4 and eq["openrlhf"]["--n_samples_per_prompt"] == 4


def test_mask_truncated_maps_to_trl():
    assert card(mask_truncated=True)["equivalents"]["trl"]["mask_truncated_completions"] is True


# --------------------------------------------------------------------------------------------- once-bugs (regressions)


def test_openrlhf_gspo_equivalent():
    eq = card(preset="gspo")["equivalents"]["openrlhf"]
    assert eq["--policy_loss_type"] == "gspo"
    assert card(preset="grpo")["equivalents"]["openrlhf"]["--policy_loss_type"] == "ppo"


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
