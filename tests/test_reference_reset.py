"""The periodic reference reset (algorithm.ref_reset_every, ProRL; grpolab/training/reference.py): after the update of
every N-th step the reference holds exactly the policy's weights (LoRA: its merged weights), the optimizer is cleared
when asked, the metrics say when it happened, a resume after a reset restores the reset reference bit for bit, and a
reset without a reference is refused."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import earnable
import pytest
import torch
from safetensors.torch import load_file

from grpolab.card import objective_card
from grpolab.config import from_dict
from grpolab.errors import ConfigError
from grpolab.models import checkpoint as ckpt
from grpolab.models.lora import AdapterOff, MergedWeights
from grpolab.runs import resume_run, start_run
from grpolab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
VOLATILE = ("time/", "throughput/", "memory/")


def config(model_dir: str, out: Path, name: str, **algorithm) -> dict:
    """A tiny run with a KL to the reference (beta > 0) and an earnable reward (tests/earnable.py), reset every 2."""
    return {
        "model": {"name": model_dir},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "reward": earnable.reward_config(),
        "rollout": earnable.rollout_config(group_size=4),
        "algorithm": {"preset": "grpo", "beta": 0.04, "entropy_coef": 0.0, "ref_reset_every": 2, **algorithm},
        "train": {"steps": 3, "prompts_per_step": 2, "micro_batch_size": 8, "lr": 5e-3, "seed": 0, "save_every": 1},
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    }


def params(model, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The parameters by name, copied (in `dtype`: the reference's, bf16 in a bf16 run)."""
    return {k: v.detach().to(dtype or v.dtype, copy=True) for k, v in model.named_parameters()}


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "algorithm, field",
    [
        ({"beta": 0.0}, "algorithm.ref_reset_every: expected 0 when algorithm.beta is 0"),
        ({"ref_reset_every": 0, "ref_reset_optimizer": True}, "algorithm.ref_reset_optimizer: expected false"),
    ],
)
def test_a_reset_without_a_reference_is_refused(tiny_model_dir, tmp_path, algorithm, field):
    cfg = from_dict(config(tiny_model_dir, tmp_path, "refused", **algorithm))
    with pytest.raises(ConfigError, match=field):
        Trainer(cfg, tmp_path / "refused")


def test_the_reference_becomes_the_policy_after_every_nth_update_and_the_optimizer_is_cleared(tiny_model_dir, tmp_path):
    cfg = from_dict(config(tiny_model_dir, tmp_path, "reset"))  # ref_reset_optimizer not set: as ProRL, cleared
    trainer, _ = start_run(cfg)
    base = params(trainer.reference)
    m1, _ = trainer.train_step()
    assert equal(params(trainer.reference), base), "step 1: still the base model"
    assert not equal(params(trainer.policy, trainer.reference_dtype), base) and trainer.optimizer.state
    # equal weights: the KL is rounding only -- fp32: the policy's training forward and the reference's no-grad one
    # may add in another order (1.9e-14 with torch's AVX2 kernels, exactly 0 with AVX-512's); bf16: rounded weights
    floor = 1e-10 if trainer.update_precision == "fp32" else 1e-5
    assert (m1["reference/resets"], m1["reference/last_reset_step"]) == (0, 0) and m1["policy/kl"] <= floor
    m2, _ = trainer.train_step()
    after_reset = params(trainer.policy, trainer.reference_dtype)
    assert equal(params(trainer.reference), after_reset), "step 2: pi_ref <- pi_theta, bit for bit"
    assert not trainer.optimizer.state, "the default (null) clears AdamW's moments at a reset, as ProRL"
    assert (m2["reference/resets"], m2["reference/last_reset_step"]) == (1, 2)
    assert m2["policy/kl"] > 100 * max(floor, 1e-7), "step 2 still measures from the base model, a step away"
    m3, _ = trainer.train_step()
    assert equal(params(trainer.reference), after_reset), "step 3: the reference stays the step-2 policy"
    assert trainer.updater.reference is trainer.reference and trainer.optimizer.state
    assert (m3["reference/resets"], m3["reference/last_reset_step"]) == (1, 2)
    assert m3["policy/kl"] <= floor, "the KL of step 3 is measured from the step-2 policy: its first pass has ratio 1"
    trainer.close()


def stub_trainer(cfg, step: int) -> SimpleNamespace:
    """What Trainer.reset_reference_if_due reads: a one-layer policy and reference, and AdamW after one step."""
    policy, reference = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.1)
    policy(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    return SimpleNamespace(
        cfg=cfg,
        reference=reference,
        policy=policy,
        reference_dtype=torch.float32,
        updater=SimpleNamespace(reference=reference),
        optimizer=optimizer,
        step=step,
        ref_resets=0,
        ref_reset_step=0,
    )


@pytest.mark.parametrize(
    "optimizer, cleared",
    [({}, True), ({"ref_reset_optimizer": None}, True), ({"ref_reset_optimizer": False}, False)],
)
def test_a_reset_clears_the_optimizer_unless_told_not_to(tiny_model_dir, tmp_path, optimizer, cleared):
    """ProRL resets the optimizer with the reference: the default (null) does; an explicit false keeps the moments
    (the old behaviour). The card's formula says which."""
    cfg = from_dict(config(tiny_model_dir, tmp_path, "stub", **optimizer))
    trainer = stub_trainer(cfg, step=2)
    Trainer.reset_reference_if_due(trainer)
    assert trainer.ref_resets == 1 and torch.equal(trainer.reference.weight, trainer.policy.weight)
    assert (not trainer.optimizer.state) == cleared
    card = objective_card(cfg)
    assert card["choices"]["ref_reset_optimizer"] is cleared
    said = "pi_ref <- pi_theta every 2 steps " + ("(optimizer cleared, as ProRL)" if cleared else "(optimizer kept)")
    assert said in card["formula"]
    kept = stub_trainer(cfg, step=3)
    Trainer.reset_reference_if_due(kept)  # not a reset step: nothing changes
    assert kept.ref_resets == 0 and kept.optimizer.state


def test_a_lora_reference_becomes_a_merged_copy_at_its_first_reset(tiny_model_dir, tmp_path):
    raw = config(tiny_model_dir, tmp_path, "lora")
    raw["model"]["lora"] = {"rank": 4, "alpha": 8.0}
    trainer, _ = start_run(from_dict({**raw, "train": {**raw["train"], "steps": 2}}))
    assert isinstance(trainer.reference, AdapterOff)
    trainer.train_step()
    assert isinstance(trainer.reference, AdapterOff)
    trainer.train_step()
    merged = {k: v.detach().to(trainer.reference_dtype) for k, v in MergedWeights(trainer.policy).items()}
    ref = dict(trainer.reference.named_parameters(remove_duplicate=False))
    assert merged.keys() == ref.keys() and all(torch.equal(merged[k], ref[k]) for k in merged)
    assert trainer.updater.reference is trainer.reference
    trainer.close()


def test_a_resume_after_a_reset_equals_the_uninterrupted_run(tiny_model_dir, tmp_path):
    """Stopped after step 3's checkpoint (the reference reset at step 2 and is no longer the base model), resumed:
    metrics, samples and final weights equal the uninterrupted 5-step run's, and the checkpoint's reference is the
    step-2 policy."""
    raw = config(tiny_model_dir, tmp_path, "whole")
    raw["train"]["steps"] = 5
    whole, _ = start_run(from_dict(raw))
    whole.fit()

    class Stop(Exception):
        pass

    def stop_at_4(step: int, metrics: dict) -> None:
        if step == 4:  # logged, not checkpointed: the resume starts from step-3 and cuts this row off
            raise Stop

    cut, _ = start_run(from_dict({**raw, "run": {**raw["run"], "name": "cut"}}))
    with pytest.raises(Stop):
        cut.fit(on_step=stop_at_4)
    run_a, run_b = tmp_path / "whole", tmp_path / "cut"
    saved = ckpt.load_state(run_b / "checkpoints" / "step-3")["reference"]
    assert (saved["resets"], saved["last_reset_step"]) == (1, 2)
    step2 = load_file(run_b / "checkpoints" / "step-2" / "model.safetensors")
    assert all(torch.equal(w, step2[k].to(w.dtype)) for k, w in saved["weights"].items() if k in step2)

    resumed, path = resume_run(run_b, [], allow_changes=False)
    assert path.name == "step-3" and resumed.ref_reset_step == 2 and not isinstance(resumed.reference, AdapterOff)
    resumed.fit()
    ra, rb = rows(run_a / "metrics.jsonl"), rows(run_b / "metrics.jsonl")
    assert [r["step"] for r in rb] == [1, 2, 3, 4, 5]
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith(VOLATILE)}  # noqa: E731
    assert [strip(r) for r in ra] == [strip(r) for r in rb]
    assert rb[-1]["reference/resets"] == 2 and rb[-1]["reference/last_reset_step"] == 4
    assert rows(run_a / "samples.jsonl") == rows(run_b / "samples.jsonl")
    wa = load_file(ckpt.latest_checkpoint(run_a) / "model.safetensors")
    wb = load_file(ckpt.latest_checkpoint(run_b) / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)  # bitwise
