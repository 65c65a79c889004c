"""PPO with a critic (grpolab/baselines/ppo.py, grpolab/baselines/critic.py) on the tiny random model: it earns the newline reward of
tests/earnable.py within a few steps (and a flipped advantage sign unlearns it), the critic learns the returns,
the card names the peers' settings, and a resume from a checkpoint restores the value model and its optimizer
exactly (the resumed run's metrics, weights and value weights equal an uninterrupted run's)."""

from __future__ import annotations

import json
from pathlib import Path

import earnable
import pytest
import torch
from safetensors.torch import load_file

from grpolab.baselines.ppo import GAEStep
from grpolab.baselines.sft_bon import budget_of
from grpolab.card import formula, objective_card
from grpolab.config import from_dict
from grpolab.evaluation.overlap import find_manifest
from grpolab.models import checkpoint as ckpt
from grpolab.runs import resume_run, start_run

pytestmark = pytest.mark.usefixtures("one_thread")
VOLATILE = ("time/", "throughput/", "memory/")


def ppo_config(model_dir: str, out: Path, name: str, **train) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4),
        "algorithm": {"estimator": "gae", "beta": 0.0, "gamma": 1.0, "lam": 0.95, "whiten": True},
        "critic": {"lr": 1e-2},
        "train": {
            "steps": 6,
            "prompts_per_step": 4,
            "micro_batch_size": 16,
            "lr": 5e-3,
            "seed": 0,
            "samples_per_step": 2,
            "save_every": 0,
            "precision": "fp32",
            **train,
        },
        "run": {"output_dir": str(out), "name": name},
    }


def test_the_estimator_registry_holds_ppo_and_refuses_an_unknown_one():
    from grpolab.training.estimators import ESTIMATORS, estimator_spec

    assert ESTIMATORS["gae"].build is GAEStep
    assert estimator_spec(from_dict({})) is ESTIMATORS["group"]


def test_the_card_names_the_peer_settings():
    card = objective_card(
        from_dict(
            {
                "algorithm": {
                    "estimator": "gae",
                    "beta": 0.05,
                    "kl_placement": "reward",
                    "kl_estimator": "k1",
                    "gamma": 0.99,
                    "lam": 0.9,
                },
                "critic": {"value_clip": 0.3},
            }
        )
    )
    assert "GAE(gamma=0.99, lambda=0.9)" in card["formula"] and "0.05 KL_k1" in card["formula"]
    eq = card["equivalents"]
    assert eq["verl"]["advantage"]["settings"] == {
        "algorithm.adv_estimator": "gae",
        "algorithm.gamma": 0.99,
        "algorithm.lam": 0.9,
        "critic.cliprange_value": 0.3,
        "critic.optim.lr": 1e-5,
    }
    assert eq["verl"]["kl"]["match"] == "exact" and eq["verl"]["kl"]["settings"]["algorithm.use_kl_in_reward"] is True
    assert eq["openrlhf"]["advantage"]["settings"]["--algo.advantage.estimator"] == "gae"
    assert eq["openrlhf"]["advantage"]["settings"]["--algo.advantage.lambd"] == 0.9
    assert all(row["match"] == "none" for axis, row in eq["trl"].items() if isinstance(row, dict) and "match" in row)
    assert card["choices"]["critic"]["value_clip"] == 0.3
    assert objective_card(from_dict({}))["choices"]["estimator"] == "group"
    assert (
        "critic" not in objective_card(from_dict({}))["choices"]
        and "GAE" not in objective_card(from_dict({}))["formula"]
    )


@pytest.mark.parametrize(
    "algorithm, loss, loss_tex",
    [
        (
            {"surrogate": "gspo", "aggregation": "seq_mean_token_sum_norm", "eps_low": 3e-4, "eps_high": 4e-4},
            "L = -(1/(B*64)) sum_i sum_t [ min(s_i = exp(mean_t log r_it) A_it, clip(s_i = exp(mean_t log r_it), 1-0.0003, "
            "1+0.0004) A_it) ]",
            r"\mathcal{L} = -\frac{1}{B \cdot L_{max}}\sum_i\sum_t\Big[\min\big(s_i A_{i,t},\ \mathrm{clip}(s_i, 1-0.0003, "
            r"1+0.0004) A_{i,t}\big)\Big]",
        ),
        (
            {
                "surrogate": "dual_clip",
                "aggregation": "token_mean",
                "beta": 0.04,
                "kl_placement": "loss",
                "entropy_coef": 0.01,
            },
            "L = -(1/sum_i |o_i|) sum_i sum_t [ min(r_it A_it, clip(r_it, 1-0.2, 1+0.2) A_it), capped at 3.0 A_it for "
            "A_it < 0 - 0.04 KL_k3(pi_theta || pi_ref) + 0.01 H_it ]",
            r"\mathcal{L} = -\frac{1}{\sum_i |o_i|}\sum_i\sum_t\Big[\min\big(r_{i,t} A_{i,t},",
        ),
    ],
)
def test_the_ppo_formula_is_the_loss_that_is_optimised(algorithm, loss, loss_tex):
    """The card prints the run's own aggregation and surrogate (the policy loss is GRPO's code, with per-token
    advantages), not a fixed mean over tokens of the token-ratio surrogate."""
    text, tex = formula(from_dict({"algorithm": {"estimator": "gae", "beta": 0.0, **algorithm}}))
    assert text.startswith(loss + ",  A_it = GAE(gamma=1.0, lambda=0.95) of r_t"), text
    assert tex.startswith(loss_tex), tex
    assert "critic: L_V = mean_tokens 0.5 max((V-G)^2" in text


def test_ppo_earns_the_reward_and_a_flipped_sign_unlearns_it(tiny_model_dir, tmp_path, monkeypatch):
    trainer, _ = start_run(from_dict(ppo_config(tiny_model_dir, tmp_path, "up")))
    assert isinstance(trainer.estimator, GAEStep)
    before = earnable.fresh_reward(trainer)
    metrics = trainer.fit()
    after = earnable.fresh_reward(trainer)
    assert after > before + 0.2, (before, after)
    assert metrics["value/mean"] != 0.0 and metrics["value/loss"] > 0  # the critic was trained and is used
    lines = [json.loads(x) for x in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["value/explained_var"] > lines[0]["value/explained_var"]
    found = find_manifest(trainer.run_dir)  # the budget `grpolab compare` and the report show
    b = budget_of(*found)
    assert (b["completions_sampled"], b["optimizer_steps"]) == (6 * 4 * 4, 6)
    assert b["wall_s"] == pytest.approx(sum(r["time/step_s"] for r in lines)) and b["peak_memory_mb"] > 0

    import grpolab.baselines.ppo as ppo_module

    real = ppo_module.whiten
    monkeypatch.setattr(ppo_module, "whiten", lambda x, m, s=None: -real(x, m, s))
    down, _ = start_run(from_dict(ppo_config(tiny_model_dir, tmp_path, "down", steps=3)))
    down.fit()
    assert earnable.fresh_reward(down) < before - 0.05


class Stop(Exception):
    pass


def _rows(path: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(x).items() if not k.startswith(VOLATILE)} for x in path.read_text().splitlines()
    ]


def test_resume_restores_the_value_model_and_its_optimizer(tiny_model_dir, tmp_path):
    whole, _ = start_run(from_dict(ppo_config(tiny_model_dir, tmp_path, "whole", steps=4, save_every=2)))
    whole.fit()
    part, _ = start_run(from_dict(ppo_config(tiny_model_dir, tmp_path, "part", steps=4, save_every=2)))

    def crash(step, metrics):
        if step == 3:  # after the checkpoint of step 2, before that of step 4: as a kill would
            raise Stop

    with pytest.raises(Stop):
        part.fit(crash)
    state = ckpt.load_state(ckpt.latest_checkpoint(tmp_path / "part"))
    assert set(state["critic"]) == {"weights", "optimizer"} and state["critic"]["optimizer"]["state"]
    resumed, path = resume_run(tmp_path / "part", [], allow_changes=False)
    assert isinstance(resumed.estimator, GAEStep) and path.name == "step-2"
    restored = resumed.estimator.critic.model.state_dict()
    assert restored.keys() == state["critic"]["weights"].keys()
    assert all(torch.equal(restored[k], v) for k, v in state["critic"]["weights"].items())
    assert not all(
        torch.equal(restored[k], v) for k, v in part.estimator.critic.model.state_dict().items()
    )  # step 3's differ
    resumed.fit()
    assert _rows(tmp_path / "whole" / "metrics.jsonl") == _rows(tmp_path / "part" / "metrics.jsonl")
    wa = load_file(ckpt.latest_checkpoint(tmp_path / "whole") / "model.safetensors")
    wb = load_file(ckpt.latest_checkpoint(tmp_path / "part") / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ca, cb = whole.estimator.critic.model.state_dict(), resumed.estimator.critic.model.state_dict()
    assert all(torch.equal(ca[k], cb[k]) for k in ca)
