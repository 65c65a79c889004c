"""algorithm.pi_old: sampler (verl's bypass mode; the DPPO presets' anchor): the ratio's denominator is the sampler's
own log-probabilities q, not a recomputed pi_old. Checked on the update itself (at mu = 1 a recomputed pi_old equals
the current policy, so `policy/approx_kl_old` is 0; against q it is the known gap), on the card, and in the
refusals of the corrections it would make constant."""

from __future__ import annotations

import pytest
import torch

from grpolab.config import from_dict, recorded_config
from grpolab.errors import ConfigError


def test_the_dppo_presets_anchor_on_the_sampler_and_old_runs_keep_the_trainer():
    assert from_dict({"algorithm": {"preset": "dppo_tv"}}).algorithm.pi_old == "sampler"
    assert from_dict({"algorithm": {"preset": "dppo_kl"}}).algorithm.pi_old == "sampler"
    assert from_dict({}).algorithm.pi_old == "trainer"
    old_run = recorded_config({"algorithm": {"preset": "dppo_tv"}})  # a manifest written before the field
    assert from_dict(old_run).algorithm.pi_old == "trainer"


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"algorithm": {"is_mode": "token_truncate"}}, "algorithm.is_mode"),
        ({"algorithm": {"is_reject": "geometric"}}, "algorithm.is_reject"),
    ],
)
def test_corrections_that_would_be_constant_are_refused(extra, field):
    raw = {"algorithm": {"pi_old": "sampler"}, "rollout": {}}
    for section, values in extra.items():
        raw[section] = {**raw.get(section, {}), **values}
    with pytest.raises(ConfigError, match=rf"^{field}: expected .* with algorithm.pi_old sampler"):
        from_dict(raw)


def test_asynchronous_training_accepts_the_sampler_anchor_without_a_weight():
    raw = {"rollout": {"engine": "grpolab_process", "max_staleness": 1}, "train": {"steps": 4}}
    with pytest.raises(ConfigError, match="algorithm.is_mode: expected an importance weight"):
        from_dict(raw)
    assert from_dict({**raw, "algorithm": {"pi_old": "sampler"}}).algorithm.pi_old == "sampler"


def test_the_card_says_which_pi_old():
    from grpolab.card import objective_card

    card = objective_card(from_dict({"algorithm": {"preset": "dppo_tv"}}))
    assert card["choices"]["pi_old"] == "sampler"
    assert card["formula"].endswith("pi_old = q (the sampler's log-probabilities)")
    verl = card["equivalents"]["verl"]["importance_sampling"]
    assert verl["match"] == "nearest" and verl["settings"]["algorithm.rollout_correction.bypass_mode"] is True
    assert "pi_old" not in objective_card(from_dict({}))["formula"].split("A_i =")[-1]


@pytest.mark.parametrize("pi_old", ["trainer", "sampler"])
def test_the_update_takes_the_ratio_against_q(tiny_model_dir, tmp_path, one_thread, pi_old):
    """One update at mu = 1 of a synthetic batch whose sampler log-probabilities are the policy's own minus 0.3 on
    every token: against a recomputed pi_old approx_kl_old = 0.5 (logp - pi_old)^2 is 0; against q it is
    0.5 x 0.3^2 = 0.045 on every token (the forward is the same one, so to float32 rounding)."""
    from grpolab.training.memory_fit import synthetic_rollout
    from grpolab.training.trainer import Trainer

    raw = {
        "model": {"name": tiny_model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 8, "num_test": 4}},
        "rollout": {"group_size": 4, "max_new_tokens": 6, "dtype": "float32"},
        "algorithm": {"beta": 0.0, "pi_old": pi_old},
        "train": {"steps": 1, "prompts_per_step": 1, "micro_batch_size": 4, "precision": "fp32", "device": "cpu"},
    }
    with Trainer(from_dict(raw), tmp_path) as trainer:
        vocab = trainer.policy.get_input_embeddings().weight.shape[0]
        rollout = synthetic_rollout(4, 5, 6, vocab, trainer.device)
        rollout.group = torch.zeros(4, dtype=torch.long)
        own = trainer.updater.logprobs_no_grad(trainer.policy, rollout, "fp32")
        rollout.sampler_logprobs = own - 0.3
        metrics = trainer.updater.update(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.ones(4, dtype=torch.bool))
    expected = 0.045 if pi_old == "sampler" else 0.0
    assert metrics["policy/approx_kl_old"] == pytest.approx(expected, abs=1e-6)
