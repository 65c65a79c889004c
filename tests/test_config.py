"""Config tree (grpolab.config): validation messages, YAML/--set parsing, preset expansion (docs/design.md section 4).

The expected preset values below are written out from the papers and docs/design.md, not read from presets.py, so a
change to a preset's meaning fails here until this file (and docs/algorithms.md) is updated on purpose.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml

from grpolab.algo.importance import ISParams, RejectParams
from grpolab.algo.loss import ObjectiveParams
from grpolab.algo.surrogate import ClipParams, PolicyLossParams
from grpolab.config import AlgorithmConfig, Config, from_dict, load_config, parse_override, set_path, to_dict
from grpolab.config import build as config_build
from grpolab.config import checks as config_checks
from grpolab.errors import ConfigError
from grpolab.presets import PRESETS

# --------------------------------------------------------------------------------------------- presets

COMMON = {
    "baseline": "group_mean",
    "scaling": "group_std",
    "std_kind": "sample",
    "adv_eps": 1e-6,
    "surrogate": "ppo_clip",
    "eps_low": 0.2,
    "eps_high": 0.2,
    "dual_clip_c": 3.0,
    "cispo_eps_low": 1.0,
    "cispo_eps_high": 4.0,
    "sapo_tau_pos": 1.0,
    "sapo_tau_neg": 1.05,
    "cov_ratio": 2e-4,
    "clip_cov_lb": 1.0,
    "clip_cov_ub": 5.0,
    "kl_cov_coef": 0.1,
    "clip_cov_select": "random",
    "dppo_low": 0.15,
    "dppo_high": 0.15,
    "dppo_ratio_cap": 20.0,
    "aggregation": "seq_mean_token_mean",
    "l_max": 0,
    "beta": 0.0,
    "kl_estimator": "k3",
    "kl_placement": "loss",
    "kl_bias_correction": False,
    "pi_old": "trainer",
    "is_mode": "none",
    "is_c_max": 2.0,
    "is_c_min": 0.5,
    "is_reject": "none",
    "is_reject_lo": 0.999,
    "is_reject_hi": 1.001,
    "offpolicy_mask_delta": 0.0,
    "entropy_coef": 0.0,
    "mask_truncated": False,
    "overlong_buffer": 0,
    "overlong_penalty": 1.0,
    "dynamic_sampling": False,
    "max_extra_rounds": 0,
    "estimator": "group",
    "pass_k": 4,
    "pass_threshold": 1.0,
    "ref_reset_every": 0,
    "ref_reset_optimizer": None,
    "gamma": 1.0,
    "lam": 0.95,
    "whiten": True,
}
EXPECTED_PRESETS = {
    # DeepSeekMath GRPO: group mean / sample std (torch.std), clip 0.2 both sides, k3 KL in the loss at 0.04,
    # per-sequence token mean.
    "grpo": {**COMMON, "preset": "grpo", "beta": 0.04},
    # DAPO: clip-higher 0.2 / 0.28, token-level mean over the batch, no KL, dynamic sampling (refill budget 3),
    # soft overlong punishment (buffer 16 tokens, factor 1).
    "dapo": {
        **COMMON,
        "preset": "dapo",
        "eps_high": 0.28,
        "aggregation": "token_mean",
        "dynamic_sampling": True,
        "max_extra_rounds": 3,
        "overlong_buffer": 16,
    },
    # Dr. GRPO: no std scaling, token sum normalised by a constant (L_max), no KL.
    "dr_grpo": {**COMMON, "preset": "dr_grpo", "scaling": "none", "aggregation": "seq_mean_token_sum_norm"},
    # RLOO: leave-one-out baseline, no scaling, no KL.
    "rloo": {**COMMON, "preset": "rloo", "baseline": "leave_one_out", "scaling": "none"},
    # GSPO: sequence-level (length-normalised) ratio, clip 3e-4 / 4e-4, no KL.
    "gspo": {**COMMON, "preset": "gspo", "surrogate": "gspo", "eps_low": 3e-4, "eps_high": 4e-4},
    # CISPO (MiniMax-M1): clipped detached IS weight on a REINFORCE term, token mean over the batch, no KL.
    "cispo": {**COMMON, "preset": "cispo", "surrogate": "cispo", "aggregation": "token_mean"},
    # GMPO: geometric mean of token ratios, clipped to [-0.4, 0.4] in log space, no KL.
    "gmpo": {**COMMON, "preset": "gmpo", "surrogate": "gmpo", "eps_low": 0.4, "eps_high": 0.4},
    # SAPO: soft gate, no KL.
    "sapo": {**COMMON, "preset": "sapo", "surrogate": "sapo"},
    # IcePop: GRPO with the mismatch weight masked outside [0.5, 5] (token_mask).
    "icepop": {**COMMON, "preset": "icepop", "beta": 0.04, "is_mode": "token_mask", "is_c_min": 0.5, "is_c_max": 5.0},
    # ScaleRL: CISPO, prompt-level average, batch std, zero-variance filtering without refill, no KL.
    "scalerl": {
        **COMMON,
        "preset": "scalerl",
        "surrogate": "cispo",
        "aggregation": "prompt_mean_token_mean",
        "scaling": "batch_std",
        "dynamic_sampling": True,
    },
    # DPPO-Binary-TV / -KL: the divergence mask in place of the clip, with the paper's recipe: no std scaling, token
    # sum over a constant, no KL; TV bounds 0.15, binary-KL bounds 0.05; the trust region anchored on the sampler's q.
    "dppo_tv": {
        **COMMON,
        "preset": "dppo_tv",
        "pi_old": "sampler",
        "surrogate": "dppo_tv",
        "scaling": "none",
        "aggregation": "seq_mean_token_sum_norm",
    },
    "dppo_kl": {
        **COMMON,
        "preset": "dppo_kl",
        "pi_old": "sampler",
        "surrogate": "dppo_kl",
        "dppo_low": 0.05,
        "dppo_high": 0.05,
        "scaling": "none",
        "aggregation": "seq_mean_token_sum_norm",
    },
    # LUSPO: GSPO (clip 3e-4 / 4e-4) with each sequence's loss times its length (token sum), no KL.
    "luspo": {
        **COMMON,
        "preset": "luspo",
        "surrogate": "gspo",
        "eps_low": 3e-4,
        "eps_high": 4e-4,
        "aggregation": "seq_mean_token_sum",
    },
}


def test_expected_presets_cover_every_algorithm_field_and_every_preset():
    fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    for name, expected in EXPECTED_PRESETS.items():
        assert set(expected) == fields, name
    assert set(EXPECTED_PRESETS) == set(PRESETS)


@pytest.mark.parametrize("preset", sorted(EXPECTED_PRESETS))
def test_preset_expands_into_exactly_the_documented_fields(preset):
    cfg = from_dict({"algorithm": {"preset": preset}})
    assert to_dict(cfg)["algorithm"] == EXPECTED_PRESETS[preset]


@pytest.mark.parametrize("preset", sorted(EXPECTED_PRESETS))
def test_preset_via_set_override_gives_the_same_config(preset):
    assert load_config(None, [f"algorithm.preset={preset}"]) == from_dict({"algorithm": {"preset": preset}})


def test_default_config_is_the_grpo_preset():
    assert to_dict(from_dict({}))["algorithm"] == EXPECTED_PRESETS["grpo"]
    assert from_dict({}) == Config()
    assert to_dict(Config())["algorithm"] == EXPECTED_PRESETS["grpo"]  # AlgorithmConfig's defaults are GRPO's


@pytest.mark.parametrize("preset", sorted(EXPECTED_PRESETS))
def test_preset_holds_only_its_differences_from_the_defaults(preset):
    """presets.py lists a preset's fields that differ from AlgorithmConfig's defaults, and nothing else."""
    defaults = to_dict(Config())["algorithm"]
    expected_differences = {k: v for k, v in EXPECTED_PRESETS[preset].items() if k != "preset" and v != defaults[k]}
    assert PRESETS[preset] == expected_differences


@pytest.mark.parametrize("params", [ClipParams, ISParams, ObjectiveParams, PolicyLossParams, RejectParams])
def test_algo_parameter_classes_have_no_defaults_of_their_own(params):
    """The algorithm defaults are defined once (AlgorithmConfig); algo/'s parameter classes take every value."""
    assert all(
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in dataclasses.fields(params)
    )
    with pytest.raises(TypeError):
        params()


def test_user_field_overrides_preset():
    cfg = from_dict({"algorithm": {"preset": "dapo", "beta": 0.01}})
    assert cfg.algorithm.beta == 0.01
    assert to_dict(cfg)["algorithm"] == {**EXPECTED_PRESETS["dapo"], "beta": 0.01}


def test_user_field_overrides_preset_whatever_the_order_of_set_flags():
    a = load_config(None, ["algorithm.beta=0.01", "algorithm.preset=dapo"])
    b = load_config(None, ["algorithm.preset=dapo", "algorithm.beta=0.01"])
    assert a == b and a.algorithm.beta == 0.01 and a.algorithm.eps_high == 0.28


def test_user_field_overrides_preset_from_yaml_and_set(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algorithm:\n  preset: gspo\n  eps_high: 5.0e-4\n")
    cfg = load_config(p, ["algorithm.entropy_coef=0.01"])
    assert (cfg.algorithm.surrogate, cfg.algorithm.eps_low, cfg.algorithm.eps_high) == ("gspo", 3e-4, 5e-4)
    assert cfg.algorithm.entropy_coef == 0.01


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(
        ConfigError,
        match=r"algorithm\.preset: expected one of 'grpo', 'dapo', 'dr_grpo', 'rloo', 'gspo', 'cispo', 'gmpo', 'sapo', "
        r"'icepop', 'dppo_tv', 'dppo_kl', 'luspo', 'scalerl', got 'ppo'",
    ):
        from_dict({"algorithm": {"preset": "ppo"}})


def test_to_dict_records_the_expanded_fields_and_reloads_to_the_same_config():
    cfg = from_dict({"algorithm": {"preset": "dr_grpo", "beta": 0.02}, "rollout": {"max_new_tokens": 32}})
    d = to_dict(cfg)
    algo = d["algorithm"]
    assert set(algo) == {f.name for f in dataclasses.fields(AlgorithmConfig)}
    assert algo["scaling"] == "none" and algo["aggregation"] == "seq_mean_token_sum_norm" and algo["beta"] == 0.02
    assert type(algo["scaling"]) is str  # enum values, not enum members
    assert json.loads(json.dumps(d)) == d  # JSON-serialisable as is
    assert from_dict(d) == cfg  # a manifest's config reloads to the identical resolved config


# --------------------------------------------------------------------------------------------- errors


def test_group_size_one_names_the_field():
    with pytest.raises(ConfigError) as e:
        from_dict({"rollout": {"group_size": 1}})
    msg = str(e.value)
    assert msg.startswith("rollout.group_size: expected an integer >= 2")
    assert "got 1" in msg


def test_group_size_one_via_set_names_the_field():
    with pytest.raises(ConfigError, match=r"^rollout\.group_size:"):
        load_config(None, ["rollout.group_size=1"])


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"algorithm": {"bta": 0.1}}, "unknown field 'algorithm.bta'; did you mean 'algorithm.beta'?"),
        ({"trian": {"steps": 2}}, "unknown field 'trian'; did you mean 'train'?"),
        ({"rollout": {"temprature": 0.7}}, "unknown field 'rollout.temprature'; did you mean 'rollout.temperature'?"),
        ({"algorithm": {"dynamic_sampleing": True}}, "did you mean 'algorithm.dynamic_sampling'?"),
    ],
)
def test_unknown_field_suggests_the_closest(raw, message):
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert message in str(e.value)


def test_unknown_field_without_close_match_lists_known_fields():
    with pytest.raises(ConfigError) as e:
        from_dict({"run": {"zzzzzz": 1}})
    assert str(e.value) == (
        "unknown field 'run.zzzzzz'; known fields: output_dir, name, report_to, mlflow_tracking_uri, "
        "table_every_steps, table_groups"
    )


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"train": {"steps": "ten"}}, "train.steps: expected an integer, got 'ten'"),
        ({"train": {"steps": 2.5}}, "train.steps: expected an integer, got 2.5"),
        ({"train": {"steps": True}}, "train.steps: expected an integer, got True"),  # bool is not an int here
        ({"algorithm": {"beta": "a lot"}}, "algorithm.beta: expected a finite number, got 'a lot'"),
        ({"algorithm": {"beta": False}}, "algorithm.beta: expected a finite number, got False"),
        (
            {"algorithm": {"dynamic_sampling": "yes please"}},
            "algorithm.dynamic_sampling: expected true or false, got 'yes please'",
        ),
        (
            {"algorithm": {"aggregation": "token-mean"}},
            "algorithm.aggregation: expected one of 'seq_mean_token_mean', 'token_mean', 'seq_mean_token_sum_norm', "
            "'seq_mean_token_sum', 'prompt_mean_token_mean', got 'token-mean'",
        ),
        ({"algorithm": {"kl_estimator": "k4"}}, "algorithm.kl_estimator: expected one of 'k1', 'k2', 'k3', got 'k4'"),
        ({"model": {"dtype": "float16"}}, "model.dtype: expected one of 'float32', 'bfloat16', got 'float16'"),
        ({"task": {"options": [1, 2]}}, "task.options: expected a mapping, got [1, 2]"),
        ({"train": 5}, "train: expected a mapping of fields, got 5"),
    ],
)
def test_wrong_type_names_field_and_expectation(raw, message):
    with pytest.raises(ConfigError) as e:
        from_dict(raw)
    assert str(e.value) == message


def test_int_accepted_for_float_field():
    cfg = from_dict({"algorithm": {"beta": 0}, "train": {"lr": 1}})
    assert cfg.algorithm.beta == 0.0 and isinstance(cfg.algorithm.beta, float)
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)


# One violating value per entry of config._RANGES; the first test fails when an entry is added without one here.
BAD_VALUES = {
    "model.lora.rank": -1,
    "model.lora.alpha": 0.0,
    "model.lora.dropout": 1.0,
    "model.lora.target_modules": [],
    "rollout.group_size": 1,
    "rollout.temperature": 0.0,
    "rollout.top_p": 1.5,
    "rollout.top_k": -1,
    "rollout.max_new_tokens": 0,
    "algorithm.adv_eps": -1e-6,
    "algorithm.eps_low": 1.0,
    "algorithm.eps_high": -0.1,
    "algorithm.dual_clip_c": 1.0,
    "algorithm.cispo_eps_low": 1.5,
    "algorithm.cispo_eps_high": -0.1,
    "algorithm.sapo_tau_pos": 0.0,
    "algorithm.sapo_tau_neg": -1.0,
    "algorithm.cov_ratio": 0.0,
    "algorithm.kl_cov_coef": -0.1,
    "algorithm.dppo_low": 0.0,
    "algorithm.dppo_high": -0.1,
    "algorithm.dppo_ratio_cap": 0.5,
    "algorithm.is_reject_lo": 0.0,
    "algorithm.is_reject_hi": 0.0,
    "algorithm.offpolicy_mask_delta": -0.1,
    "algorithm.l_max": -1,
    "algorithm.beta": -1.0,
    "algorithm.is_c_max": 0.0,
    "algorithm.is_c_min": -0.5,
    "algorithm.overlong_buffer": -1,
    "algorithm.overlong_penalty": -1.0,
    "algorithm.max_extra_rounds": -1,
    "algorithm.gamma": 1.5,
    "algorithm.pass_k": 0,
    "algorithm.ref_reset_every": -1,
    "algorithm.ref_reset_optimizer": "yes",
    "algorithm.lam": -0.1,
    "critic.lr": 0.0,
    "critic.value_clip": -0.2,
    "critic.grad_clip": -1.0,
    "train.steps": 0,
    "train.prompts_per_step": 0,
    "train.mu": 0,
    "train.minibatches": 0,
    "train.micro_batch_size": 0,
    "train.lr": 0.0,
    "train.weight_decay": -0.01,
    "train.warmup_steps": -1,
    "train.grad_clip": -1.0,
    "train.loss_scale_init": 0.5,
    "train.loss_scale_growth_interval": 0,
    "train.save_every": -1,
    "train.save_every_minutes": -1.0,
    "train.device": "gpu",
    "reward.time_limit_s": 0.0,
    "reward.model.batch_size": 0,
    "reward.model.max_length": 4,
    "reward.judge.batch_size": 0,
    "reward.judge.max_new_tokens": 0,
    "reward.judge.time_limit_s": 0,
    "reward.judge.retries": 21,
    "reward.judge.temperature": -1.0,
    "reward.judge.min_yes_no_mass": 1.5,
    "train.keep_last": 0,
    "train.adam_beta1": 1.0,
    "train.adam_beta2": -0.1,
    "train.min_lr_ratio": 2.0,
    "train.samples_per_step": -1,
    "train.max_nonfinite_steps": 0,
    "train.prompt_floor": 0.0,
    "eval.every_steps": -1,
    "eval.num_problems": 0,
    "eval.batch_size": 0,
    "eval.max_new_tokens": -1,
    "run.report_to": "tensorboard",
    "run.table_every_steps": -1,
    "run.table_groups": 0,
    "rollout.max_staleness": -1,
    "rollout.worker_threads": -1,
    "rollout.num_servers": 0,
    "rollout.servers": ["localhost:8000"],
}
# A second violating value where the range has two ends or an open end worth checking.
MORE_BAD_VALUES = [
    ("rollout.top_p", 0.0),
    ("rollout.temperature", -1.0),
    ("algorithm.eps_low", -0.1),
    ("algorithm.dual_clip_c", 0.5),
    ("train.lr", -1e-5),
    ("train.prompt_floor", 1.5),
]
# Non-finite numbers are refused for every float field when the config is built, before the ranges
# (tests/test_config_numbers.py covers every float field).
NON_FINITE_VALUES = [
    ("algorithm.beta", float("nan")),
    ("train.lr", float("nan")),
    ("algorithm.entropy_coef", float("inf")),
    ("reward.judge.max_score", float("inf")),
    ("reward.judge.min_score", float("nan")),
]


def test_bad_values_cover_every_range_entry():
    ranges = config_checks._RANGES + config_checks.loss_parameter_ranges()
    assert set(BAD_VALUES) == {path for path, _, _ in ranges}


def _raw(path: str, value) -> dict:
    raw: dict = {}
    set_path(raw, path, value)
    return raw


@pytest.mark.parametrize("path, value", list(BAD_VALUES.items()) + MORE_BAD_VALUES)
def test_out_of_range_value_names_the_field(path, value):
    expected = {p: e for p, _, e in config_checks._RANGES + config_checks.loss_parameter_ranges()}[path]
    with pytest.raises(ConfigError) as e:
        from_dict(_raw(path, value))
    msg = str(e.value)
    assert msg.startswith(f"{path}: expected {expected}, got "), msg


@pytest.mark.parametrize("path, value", NON_FINITE_VALUES)
def test_non_finite_value_names_the_field(path, value):
    with pytest.raises(ConfigError, match=rf"^{re.escape(path)}: expected a finite number, got {value}$"):
        from_dict(_raw(path, value))


@pytest.mark.parametrize(
    "path, value",
    [
        ("rollout.top_p", 1.0),
        ("algorithm.eps_low", 0.0),
        ("algorithm.beta", 0.0),
        ("algorithm.is_c_min", 0.0),
        ("rollout.group_size", 2),
        ("train.grad_clip", 0.0),
        ("algorithm.l_max", 0),
    ],
)
def test_range_boundaries_that_are_allowed(path, value):
    assert config_checks.get_path(from_dict(_raw(path, value)), path) == value


def test_is_c_min_above_is_c_max_is_rejected():
    with pytest.raises(ConfigError, match=r"^algorithm\.is_c_min: expected <= algorithm\.is_c_max \(1\.5\), got 1\.6$"):
        from_dict({"algorithm": {"is_c_min": 1.6, "is_c_max": 1.5}})


def test_minibatches_must_divide_the_rollout_batch():
    with pytest.raises(
        ConfigError, match=r"^train\.minibatches: expected a divisor of prompts_per_step \* group_size = 12, got 5$"
    ):
        from_dict({"train": {"prompts_per_step": 3, "minibatches": 5}, "rollout": {"group_size": 4}})
    assert (
        from_dict({"train": {"prompts_per_step": 3, "minibatches": 6}, "rollout": {"group_size": 4}}).train.minibatches
        == 6
    )


# --------------------------------------------------------------------------------------------- YAML and --set


def test_yaml_exponent_without_dot_is_a_float(tmp_path):
    assert yaml.safe_load("lr: 1e-5") == {"lr": "1e-5"}  # YAML 1.1 reads it as a string: the reason for the fix
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 1e-5\nalgorithm:\n  beta: 4e-2\n  adv_eps: 1E-8\n")
    cfg = load_config(p)
    assert cfg.train.lr == 1e-5 and isinstance(cfg.train.lr, float)
    assert cfg.algorithm.beta == 0.04 and cfg.algorithm.adv_eps == 1e-8


def test_yaml_exponent_via_set_is_a_float():
    cfg = load_config(None, ["train.lr=3e-6"])
    assert cfg.train.lr == 3e-6 and isinstance(cfg.train.lr, float)


def test_numeric_string_is_not_accepted_for_an_int_field():
    with pytest.raises(ConfigError, match=r"^train\.steps: expected an integer, got '1e3'$"):
        load_config(None, ["train.steps=1e3"])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("train.steps=50", ("train.steps", 50)),
        (" train.steps = 50 ", ("train.steps", 50)),
        ("train.lr=1.0e-5", ("train.lr", 1e-5)),
        ("train.lr=1e-5", ("train.lr", "1e-5")),  # left to the float field to coerce
        ("algorithm.dynamic_sampling=true", ("algorithm.dynamic_sampling", True)),
        ("algorithm.dynamic_sampling=False", ("algorithm.dynamic_sampling", False)),
        ("algorithm.preset=dapo", ("algorithm.preset", "dapo")),
        ("task.options.operators=+-*", ("task.options.operators", "+-*")),
        ("x.list=[1, 2, 3]", ("x.list", [1, 2, 3])),
        ("x.list=[a, b]", ("x.list", ["a", "b"])),
        ("reward.weights={correct: 1.0, format: 0}", ("reward.weights", {"correct": 1.0, "format": 0})),
        ("run.name=a=b", ("run.name", "a=b")),  # only the first '=' separates
        ("run.name=", ("run.name", "")),
        ("model.name=bundled:smollm2-135m-instruct", ("model.name", "bundled:smollm2-135m-instruct")),
    ],
)
def test_parse_override(text, expected):
    key, value = parse_override(text)
    assert (key, config_build._from_cli(value)) == expected


def test_set_keeps_the_typed_text_for_string_fields():
    key, value = parse_override("run.name=007")
    assert config_build._from_cli(value, str) == "007" and config_build._from_cli(value, int) == 7


def test_parse_override_without_equals_sign():
    with pytest.raises(ConfigError, match=r"expected KEY=VALUE"):
        parse_override("train.steps")


def test_set_overrides_yaml_and_creates_sections(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  steps: 5\n  lr: 1.0e-5\n")
    cfg = load_config(
        p,
        ["train.steps=7", "reward.weights={correct: 1.0}", "task.options={digits: 2}", "algorithm.mask_truncated=true"],
    )
    assert cfg.train.steps == 7 and cfg.train.lr == 1e-5
    assert cfg.reward.weights == {"correct": 1.0} and cfg.task.options == {"digits": 2}
    assert cfg.algorithm.mask_truncated is True


def test_set_into_a_scalar_is_an_error():
    with pytest.raises(ConfigError, match=r"'steps' is not a mapping"):
        load_config(None, ["train.steps=3", "train.steps.x=1"])


def test_set_unknown_field_suggests():
    with pytest.raises(ConfigError, match=r"did you mean 'train\.steps'\?"):
        load_config(None, ["train.step=3"])


def test_missing_and_malformed_config_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        load_config(top)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == from_dict({})


def test_quickstart_config_loads():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml")
    assert cfg.algorithm.preset == "grpo" and cfg.algorithm.beta == 0.0 and cfg.train.lr == 1e-5


def test_config_is_frozen():
    cfg = from_dict({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.steps = 3  # type: ignore[misc]


# --------------------------------------------------------------------------------------------- once-bugs (regressions)


@pytest.mark.parametrize("value", [5, "dapo", [1, 2]])
def test_algorithm_section_not_a_mapping_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"^algorithm: expected a mapping"):
        from_dict({"algorithm": value})


def test_unhashable_preset_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^algorithm\.preset: expected one of"):
        from_dict({"algorithm": {"preset": ["dapo"]}})


@pytest.mark.parametrize(
    "path, value",
    [
        ("train.adam_beta1", 1.0),  # AdamW: 0 <= beta < 1
        ("train.adam_beta2", -0.1),
        ("train.min_lr_ratio", 2.0),  # cosine floor must be in [0, 1]
        ("eval.batch_size", 0),
        ("eval.max_new_tokens", -1),
        ("train.samples_per_step", -1),
        ("algorithm.entropy_coef", float("nan")),
        ("train.max_nonfinite_steps", 0),  # today only Trainer.__init__ rejects it, after the model is loaded
    ],
)
def test_unchecked_fields_are_range_checked(path, value):
    with pytest.raises(ConfigError, match="^" + re.escape(path) + ":"):
        from_dict(_raw(path, value))


def test_overlong_buffer_must_be_below_max_new_tokens():
    with pytest.raises(ConfigError, match=r"^algorithm\.overlong_buffer:"):
        from_dict({"algorithm": {"preset": "dapo"}, "rollout": {"max_new_tokens": 16}})


def test_set_numeric_looking_string_field():
    cfg = load_config(None, ["run.name=2024", "eval.split=test"])
    assert cfg.run.name == "2024"


def test_parse_option_reads_task_options_as_yaml():
    assert config_build.parse_option("max_operand=20") == ("max_operand", 20)
    assert config_build.parse_option("operators=+-") == ("operators", "+-")


def test_option_values_that_are_not_yaml_stay_text():
    """`--task-option operators=*` was a YAML alias error (a traceback); such a value is the text it is."""
    from grpolab.config import parse_option

    assert parse_option("operators=*") == ("operators", "*")
    assert parse_option("operators=+-") == ("operators", "+-")
    assert parse_option("num_test=300") == ("num_test", 300)
