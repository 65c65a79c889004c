"""End-to-end: a tiny random Llama trains for real steps on CPU and writes a complete, reloadable run."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpolab.checkpoint import latest_checkpoint
from grpolab.config import from_dict
from grpolab.runs import build_manifest
from grpolab.trainer import Trainer

REQUIRED_METRICS = [
    "reward/mean", "reward/std", "reward/correct/mean", "reward/format/mean", "reward/invalid_frac",
    "groups/frac_zero_std", "completion/len_mean", "completion/len_max", "completion/truncated_frac",
    "policy/entropy", "policy/clip_frac_low", "policy/clip_frac_high", "policy/kl", "policy/approx_kl_old",
    "sampler/logp_diff_mean", "sampler/logp_diff_max", "loss/policy", "loss/kl", "loss/total",
    "loss/signal_token_frac", "optim/grad_norm", "optim/lr", "time/rollout_s", "time/reward_s", "time/update_s",
    "time/step_s", "throughput/tokens_per_s", "memory/peak_rss_mb",
]


def tiny_config(model_dir: str, out: str, **algorithm) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "rollout": {"group_size": 4, "max_new_tokens": 6, "dtype": "float32", "temperature": 1.0},
        "algorithm": {"preset": "grpo", **algorithm},
        # A huge learning rate so two steps visibly move a random model; rewards of a random model are all 0,
        # so the format reward is weighted in a way that gives signal only by chance -- the KL term (beta > 0)
        # and the entropy bonus make sure gradients are non-zero regardless.
        "train": {"steps": 2, "prompts_per_step": 2, "micro_batch_size": 4, "lr": 1e-2, "seed": 0, "samples_per_step": 2},
        "eval": {"every_steps": 2, "num_problems": 4, "max_new_tokens": 4},
        "run": {"output_dir": out, "name": "e2e"},
    }


def run(cfg_dict: dict, run_dir) -> Trainer:
    cfg = from_dict(cfg_dict)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, run_dir)
    manifest = build_manifest(cfg, trainer.model_path, trainer.tokenizer, trainer.train_problems, trainer.eval_problems)
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    trainer.fit()
    return trainer


def test_two_steps_train_and_write_a_reloadable_run(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "e2e"
    before = {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict().items()}
    trainer = run(tiny_config(tiny_model_dir, str(tmp_path), beta=0.04, entropy_coef=0.01), run_dir)

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in REQUIRED_METRICS:
            assert key in r, key
            assert r[key] is not None and math.isfinite(r[key]), (key, r[key])
    assert "eval/accuracy" in rows[-1] and 0.0 <= rows[-1]["eval/accuracy"] <= 1.0
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and {"completion", "gold", "reward", "advantage"} <= set(samples[0])

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["config"]["algorithm"]["beta"] == 0.04 and manifest["config"]["algorithm"]["eps_high"] == 0.2
    assert manifest["hashes"]["model_weights"] and manifest["hashes"]["reward_code"]

    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None and ckpt.name == "step-2"
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt)
    changed = [k for k, v in reloaded.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) > len(before) // 2, "most parameter tensors must have moved"
    for k, v in reloaded.state_dict().items():
        assert torch.equal(v, trainer.policy.state_dict()[k]), k  # the checkpoint is the trained policy
    tok = AutoTokenizer.from_pretrained(ckpt)
    out = reloaded.generate(**tok("What is 1 + 1?", return_tensors="pt"), max_new_tokens=3, do_sample=False)
    assert out.shape[1] > 0


@pytest.mark.parametrize("preset", ["grpo", "dapo", "dr_grpo", "rloo", "gspo"])
def test_every_preset_trains(tiny_model_dir, tmp_path, preset):
    """A short real run per preset: finite loss, parameters move (the entropy bonus guarantees a gradient)."""
    cfg = tiny_config(tiny_model_dir, str(tmp_path), preset=preset, entropy_coef=0.05)
    cfg["eval"] = {"every_steps": 0}
    cfg["train"]["steps"] = 1
    if preset == "dapo":
        cfg["algorithm"]["overlong_buffer"] = 2  # the preset's 16 must stay below this test's 6 new tokens
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    trainer = run(cfg, tmp_path / preset)
    row = json.loads((tmp_path / preset / "metrics.jsonl").read_text().splitlines()[-1])
    assert math.isfinite(row["loss/total"])
    after = trainer.policy.state_dict()
    assert any(not torch.equal(after[k], before[k]) for k in before)
