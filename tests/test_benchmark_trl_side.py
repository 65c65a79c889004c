"""benchmarks/trl_side.py and quickstart_vs_trl.py: the TRL run is the grpolab run, and wall times add up."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    sys.path.insert(0, str(BENCH))  # the scripts import their neighbours (common, trl_side) by name
    try:
        spec = importlib.util.spec_from_file_location(f"grpolab_bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def quickstart(**train):
    from grpolab.config import from_dict

    raw = yaml.safe_load((BENCH.parent / "configs" / "quickstart.yaml").read_text())
    raw["train"].update(train)
    return from_dict(raw)


def test_trl_settings_are_the_quickstart_run(tmp_path):
    trl = pytest.importorskip("trl")
    side = load("trl_side")
    s = side.trl_settings(quickstart(), bf16=True, max_steps=30, gradient_checkpointing=False)
    # objective (the card's TRL row): per-sequence token mean, group std, no KL, symmetric clip 0.2, one epoch
    assert (s["loss_type"], s["scale_rewards"], s["beta"], s["epsilon"], s["epsilon_high"], s["num_iterations"]) == (
        "grpo",
        "group",
        0.0,
        0.2,
        0.2,
        1,
    )
    # the step: 4 prompts x G 8 generated at once, trained 16 at a time -> one optimizer step per rollout batch
    assert (
        s["num_generations"],
        s["generation_batch_size"],
        s["per_device_train_batch_size"],
        s["gradient_accumulation_steps"],
    ) == (8, 32, 16, 2)
    assert (s["temperature"], s["max_completion_length"], s["learning_rate"], s["max_grad_norm"]) == (
        0.8,
        48,
        1e-5,
        1.0,
    )
    assert (s["adam_beta1"], s["adam_beta2"], s["lr_scheduler_type"], s["max_steps"], s["bf16"]) == (
        0.9,
        0.99,
        "constant",
        30,
        True,
    )
    conf = trl.GRPOConfig(output_dir=str(tmp_path), save_strategy="no", **s)
    assert conf.steps_per_generation == 2 == conf.gradient_accumulation_steps  # TRL reads it the same way


def test_trl_settings_refuse_a_micro_batch_that_splits_the_step():
    pytest.importorskip("trl")
    side = load("trl_side")
    with pytest.raises(SystemExit, match="micro_batch_size=12 must divide prompts_per_step \\* group_size = 32"):
        side.trl_settings(quickstart(micro_batch_size=12), bf16=False, max_steps=1, gradient_checkpointing=False)


def test_ordered_problems_are_the_samplers_order():
    from grpolab.training.builders import load_problems
    from grpolab.training.prompt_sampler import PromptSampler

    side = load("trl_side")
    cfg = quickstart()
    got = [p.uid for p in side.ordered_problems(cfg, 12)]
    train, _, _ = load_problems(cfg)
    sampler = PromptSampler(train, cfg.train.seed)
    assert got == [p.uid for p in sampler.take(4) + sampler.take(4) + sampler.take(4)]  # three steps of 4 prompts
    assert len(set(got)) == 12


def test_wall_to_a_step_charges_the_overhead_up_front():
    bench = load("quickstart_vs_trl")
    side = {"wall_s": 100.0, "step_s": [10.0, 20.0, 30.0]}  # 40 s of loading, probing and saving
    assert [bench.wall_to(side, s) for s in (1, 2, 3)] == [50.0, 70.0, 100.0]
