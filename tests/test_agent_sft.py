"""Supervised warm start on expert episodes (grpolab/baselines/agent_sft.py): the loss is the cross-entropy of the
expert's tokens only (checked against a hand-computed sum), the data are training states only, and the result is
a checkpoint a GRPO run trains from."""

from __future__ import annotations

import json

import pytest
import torch

import grpolab.agents  # noqa: F401 -- registers the built-in environments
from grpolab.agents.env import AgentTask
from grpolab.agents.episode import EpisodeRunner
from grpolab.baselines.agent_sft import AgentSFTSettings, encode_episode, expert_data, masked_loss, run_agent_sft
from grpolab.models.load import load_causal_lm, load_tokenizer
from grpolab.rollout.grpolab_engine import eos_ids

pytestmark = pytest.mark.usefixtures("one_thread")
OPTIONS = {
    "env": "lookup",
    "difficulty": 1,
    "num_train": 6,
    "num_test": 3,
    "max_turns": 5,
    "max_turn_tokens": 32,
    "max_total_tokens": 300,
}


def test_the_loss_is_the_cross_entropy_of_the_expert_tokens_alone(tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir, "float32"), load_tokenizer(tiny_model_dir)
    solved, unsolved = expert_data(
        EpisodeRunner(model, tok, eos_ids(model, tok)), AgentTask(**OPTIONS).problems("train")
    )
    assert len(solved) == 6 and not unsolved
    encoded = [encode_episode(e) for e in solved]
    total, count = 0.0, 0
    for e in solved:  # by hand: -log p(token | everything before it), summed over the loss mask's tokens
        ids = torch.tensor([e.prompt + e.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
        for t, (token, m) in enumerate(zip(e.tokens, e.loss_mask)):
            if m:
                total -= float(logp[len(e.prompt) + t - 1, token])
                count += 1
    assert count == sum(sum(e.loss_mask) for e in solved) < sum(len(e.tokens) for e in solved)  # observations left out
    assert masked_loss(model, encoded, tok.pad_token_id, batch_size=4) == pytest.approx(total / count, rel=1e-5)


def test_a_warm_start_learns_the_expert_and_a_grpo_run_trains_from_it(tiny_model_dir, tmp_path):
    from grpolab.config import from_dict
    from grpolab.runs import start_run

    out = tmp_path / "sft"
    lines: list[str] = []
    m = run_agent_sft(tiny_model_dir, OPTIONS, AgentSFTSettings(steps=8, batch_size=4, lr=3e-3), out, log=lines.append)
    assert [ln.split()[1] for ln in lines if ln.startswith("step ")] == [
        "8/8"
    ]  # progress every 10 steps and at the end
    assert f"loss {m['losses'][-1]:.4f}" in lines[-1]
    assert m["method"] == "sft-agent-expert" and m["base_model"] == tiny_model_dir
    assert m["num_examples"] == 6 and m["unsolved_by_expert"] == 0 and m["expert"]["tool_calls_mean"] == 2.0
    assert m["loss_after"] < m["loss_before"] - 1.0
    test = {p.uid for p in AgentTask(**OPTIONS).problems("test")}
    assert len(m["train_problem_hashes"]) == 6 and not test & {p.uid for p in AgentTask(**OPTIONS).problems("train")}
    assert json.loads((out / "baseline_manifest.json").read_text())["loss_after"] == m["loss_after"]
    with pytest.raises(Exception, match="not empty"):
        run_agent_sft(tiny_model_dir, OPTIONS, AgentSFTSettings(steps=1), out)
    cfg = from_dict(
        {
            "model": {"name": str(out)},
            "task": {"name": "agent", "options": OPTIONS},
            "reward": {"weights": {"env": 1.0}},
            "rollout": {"group_size": 2, "dtype": "float32"},
            "algorithm": {"beta": 0.0},
            "train": {"steps": 1, "prompts_per_step": 1, "micro_batch_size": 4, "precision": "fp32", "save_every": 0},
            "eval": {"every_steps": 0},
            "run": {"output_dir": str(tmp_path), "name": "grpo"},
        }
    )
    trainer, _ = start_run(cfg)
    trainer.fit()
    manifest = json.loads((tmp_path / "grpo" / "manifest.json").read_text())
    assert manifest["model_path"] == str(out)
