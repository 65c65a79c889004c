"""On-policy distillation (algorithm.estimator = distill; grpolab/training/distill.py): the per-token advantage
A_it = log pi_T - log pi_old (+ reward_weight * A_i) by hand and against a float64 reference, a teacher equal to the
student moving nothing, a teacher with another tokenizer refused, and a 3-step run whose reverse KL to a different
teacher falls."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import earnable
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpolab.config import from_dict
from grpolab.errors import ConfigError
from grpolab.models import checkpoint as ckpt
from grpolab.models.checkpoint import rng_state, set_rng_state
from grpolab.rollout.base import SamplingParams
from grpolab.runs import resume_run, start_run
from grpolab.training.distill import (
    check_same_tokenizer,
    distill_advantages,
    distill_metrics,
    distill_sums,
    tokenizer_difference,
)
from grpolab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

TEACHER = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0]])
OLD = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -2.0, -4.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_the_advantage_by_hand_on_a_2x3_batch():
    # log pi_T - log pi_old = [[0.5, -1.0, (masked)], [-1.0, 1.0, 2.0]]
    assert torch.equal(distill_advantages(TEACHER, OLD, MASK), torch.tensor([[0.5, -1.0, 0.0], [-1.0, 1.0, 2.0]]))
    # + 0.1 * A_i with A = [0.5, -1.0]
    mixed = distill_advantages(TEACHER, OLD, MASK, torch.tensor([0.5, -1.0]), 0.1)
    assert torch.allclose(mixed, torch.tensor([[0.55, -0.95, 0.0], [-1.1, 0.9, 1.9]]), atol=1e-7)
    assert mixed[0, 2].item() == 0.0  # masked: exactly 0 whatever the reward term
    # reverse KL per trained token: (-0.5 + 1.0 + 1.0 - 1.0 - 2.0) / 5; teacher logp: -9 / 5
    metrics = distill_metrics(distill_sums(TEACHER, OLD, MASK))
    assert metrics == pytest.approx({"distill/reverse_kl": -0.3, "distill/teacher_logp": -1.8}, abs=1e-12)


def test_the_advantage_against_a_float64_reference_written_from_the_formula():
    gen = torch.Generator().manual_seed(0)
    teacher, old = -torch.rand(5, 7, generator=gen) * 5, -torch.rand(5, 7, generator=gen) * 5
    mask = (torch.rand(5, 7, generator=gen) > 0.3).float()
    group = torch.randn(5, generator=gen)
    ref = torch.zeros(5, 7, dtype=torch.float64)
    for i in range(5):
        for t in range(7):
            if mask[i, t]:
                ref[i, t] = (float(teacher[i, t]) - float(old[i, t])) + 0.25 * float(group[i])
    got = distill_advantages(teacher, old, mask, group, 0.25)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), ref, atol=1e-6)


def test_degenerate_batches():
    none = torch.zeros(2, 3)
    assert torch.equal(distill_advantages(TEACHER, OLD, none, torch.tensor([1.0, 2.0]), 1.0), torch.zeros(2, 3))
    assert distill_metrics(distill_sums(TEACHER, OLD, none)) == {"distill/reverse_kl": 0.0, "distill/teacher_logp": 0.0}
    assert torch.equal(distill_advantages(OLD, OLD, MASK), torch.zeros(2, 3)), "teacher = student: A = 0"
    with pytest.raises(ValueError, match="group_advantages of shape"):
        distill_advantages(TEACHER, OLD, MASK, None, 0.5)
    with pytest.raises(ValueError, match="same shape"):
        distill_advantages(TEACHER[:, :2], OLD, MASK)


# ------------------------------------------------------------------------------------------------- with models


def config(student: str, teacher: str, out: Path, name: str, **distill) -> dict:
    """A tiny distillation run: full sampling at temperature 1 (so the sampled tokens are draws from pi_old and the
    per-token estimate is the reverse KL's), the earnable reward of tests/earnable.py beside it."""
    return {
        "model": {"name": student},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "reward": earnable.reward_config(),
        "rollout": {"group_size": 8, "temperature": 1.0, "max_new_tokens": 6, "dtype": "float32"},
        "algorithm": {"preset": "grpo", "beta": 0.0, "entropy_coef": 0.0, "estimator": "distill"},
        "train": {"steps": 3, "prompts_per_step": 4, "micro_batch_size": 32, "lr": 1e-3, "seed": 0, "save_every": 0},
        "eval": {"every_steps": 0},
        "distill": {"teacher": teacher, **distill},
        "run": {"output_dir": str(out), "name": name},
    }


def test_a_teacher_equal_to_the_student_gives_zero_advantages_and_moves_nothing(tiny_model_dir, tmp_path):
    trainer, manifest = start_run(from_dict(config(tiny_model_dir, tiny_model_dir, tmp_path, "same")))
    # the teacher is on the record: its hashes (equal to the student's here) and the card's formula and choices
    assert manifest["hashes"]["teacher_weights"] == manifest["hashes"]["model_weights"]
    assert manifest["hashes"]["teacher_tokenizer"] == manifest["hashes"]["tokenizer"]
    assert manifest["teacher_path"] == tiny_model_dir
    assert "A_it = log pi_T(o_it) - log pi_old(o_it)" in manifest["objective"]["formula"]
    assert manifest["objective"]["choices"]["distill"]["teacher"] == tiny_model_dir
    before = {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}
    metrics, samples = trainer.train_step()
    assert metrics["distill/reverse_kl"] == 0.0 and metrics["loss/signal_token_frac"] == 0.0
    assert metrics["distill/teacher_logp"] < 0 and all(s["advantage"] == 0.0 for s in samples)
    after = dict(trainer.policy.named_parameters())
    assert all(torch.equal(before[k], after[k]) for k in before), "A = 0 everywhere: no update (weight_decay 0)"
    trainer.close()


def test_with_reward_weight_the_advantage_is_the_reward_term_alone_when_the_teacher_is_the_student(
    tiny_model_dir, tmp_path
):
    raw = config(tiny_model_dir, tiny_model_dir, tmp_path, "mixed", reward_weight=0.5)
    raw["rollout"] = earnable.rollout_config(group_size=8)  # top_k = 2: the reward is earned, the groups vary
    trainer, _ = start_run(from_dict(raw))
    batch = trainer.collect()
    group = batch.advantages.clone()
    assert group.abs().sum() > 0, "the earnable reward gives the groups a signal"
    trainer.estimator.prepare(trainer.advantage_context(batch))
    mask = trainer.updater.loss_mask(batch.rollout, ~batch.scores.invalid).bool()
    expected = torch.where(mask, 0.5 * group[:, None], torch.zeros(()))
    assert batch.advantages.shape == mask.shape and torch.equal(batch.advantages, expected.float())
    assert batch.metrics["distill/reverse_kl"] == 0.0
    trainer.close()


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(tiny_model_dir, tmp_path):
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model_dir, other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_special_tokens({"additional_special_tokens": ["<|tool_call|>"]})
    tok.save_pretrained(other)
    student = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert "vocabularies differ" in tokenizer_difference(student, tok)
    assert tokenizer_difference(student, AutoTokenizer.from_pretrained(tiny_model_dir)) is None
    with pytest.raises(ConfigError, match=r"distill\.teacher: the teacher .*other-tokenizer.* and the student"):
        check_same_tokenizer(student, tok, tiny_model_dir, str(other))
    cfg = from_dict(config(tiny_model_dir, str(other), tmp_path, "refused"))
    with pytest.raises(ConfigError, match=rf"{other}.* and the student {tiny_model_dir} \(model.name\)"):
        Trainer(cfg, tmp_path / "refused")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"distill": {"teacher": ""}}, "distill.teacher: expected the teacher model"),
        (
            {"algorithm": {"dynamic_sampling": True, "max_extra_rounds": 1}},
            "algorithm.dynamic_sampling: expected false",
        ),
        ({"algorithm": {"beta": 0.04, "kl_placement": "reward"}}, "algorithm.kl_placement: expected loss"),
    ],
)
def test_settings_distillation_cannot_run_with_are_refused(tiny_model_dir, tmp_path, change, message):
    raw = config(tiny_model_dir, tiny_model_dir, tmp_path, "refused")
    for section, fields in change.items():
        raw[section] = {**raw[section], **fields}
    with pytest.raises(ConfigError, match=message):
        Trainer(from_dict(raw), tmp_path / "refused")


@pytest.fixture(scope="module")
def reachable_teacher(tiny_model_dir, tmp_path_factory) -> str:
    """A different tiny teacher a few steps can move towards: the student's embeddings (which only the sampled
    tokens' rows would learn) with the transformer layers of a model initialised from another seed (which every
    token goes through)."""
    from transformers import AutoConfig

    out = tmp_path_factory.mktemp("teacher")
    student = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(1)
    teacher = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir))
    with torch.no_grad():
        teacher.model.embed_tokens.weight.copy_(student.model.embed_tokens.weight)
    teacher.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return str(out)


def exact_reverse_kl(trainer, sequences: list[tuple[torch.Tensor, int]]) -> float:
    """Mean over the completion positions of `sequences` of KL(pi || pi_T) = sum_v pi(v) (log pi(v) - log pi_T(v)),
    over the whole vocabulary (not a sampled estimate), in float64."""
    total, positions = 0.0, 0
    with torch.no_grad():
        for ids, n in sequences:
            s = torch.log_softmax(trainer.policy(input_ids=ids).logits[0, -n - 1 : -1].double(), -1)
            t = torch.log_softmax(trainer.estimator.teacher(input_ids=ids).logits[0, -n - 1 : -1].double(), -1)
            total += float((s.exp() * (s - t)).sum())
            positions += n
    return total / positions


def student_sequences(trainer, samples: int = 16) -> list[tuple[torch.Tensor, int]]:
    """(prompt + completion ids, completion length) of `samples` completions of each of 4 training prompts drawn by
    the initial student under a fixed seed (the run's RNG is put back)."""
    params = SamplingParams(group_size=samples, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6)
    prompts = [trainer.collector.prompt_ids(p) for p in trainer.train_problems[:4]]
    state = rng_state()
    try:
        torch.manual_seed(1234)
        r = trainer.engine.generate(prompts, params)
    finally:
        set_rng_state(state)
    out = []
    for i in range(len(r)):
        completion = r.completion_ids[i][r.completion_mask[i].bool()]
        out.append((torch.cat([r.prompt_ids[i][r.prompt_mask[i].bool()], completion])[None], len(completion)))
    return out


@pytest.mark.parametrize("lora", [0, 8], ids=["full", "lora"])
def test_three_steps_lower_the_reverse_kl_to_a_different_teacher(tiny_model_dir, reachable_teacher, tmp_path, lora):
    """The quantity distillation minimises, the reverse KL of the student to the teacher over the student's own
    completions, computed exactly on a fixed set of them, falls at every one of 3 steps (AdamW, lr 1e-3 for full
    fine-tuning, 5e-3 for LoRA rank 8), to under half of where it started."""
    raw = config(tiny_model_dir, reachable_teacher, tmp_path, "distil")
    if lora:
        raw["model"]["lora"] = {"rank": lora, "alpha": 2.0 * lora}
        raw["train"]["lr"] = 5e-3
    trainer, _ = start_run(from_dict(raw))
    sequences = student_sequences(trainer)
    kl = [exact_reverse_kl(trainer, sequences)]
    trainer.fit(on_step=lambda step, metrics: kl.append(exact_reverse_kl(trainer, sequences)))
    assert kl[0] > 1e-4, kl
    assert all(b < a for a, b in zip(kl, kl[1:])), f"the reverse KL must fall at every step: {kl}"
    assert kl[-1] < 0.5 * kl[0], kl
    rows = [json.loads(line) for line in (tmp_path / "distil" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all({"distill/reverse_kl", "distill/teacher_logp", "time/teacher_s"} <= set(r) for r in rows)
    assert all(r["loss/signal_token_frac"] == 1.0 for r in rows), "every trained token carries the teacher's signal"


def test_a_resumed_distillation_run_equals_the_uninterrupted_one(tiny_model_dir, reachable_teacher, tmp_path):
    """Stopped after step 2's checkpoint and resumed: the teacher is rebuilt from distill.teacher, and the metrics,
    samples and final weights equal the uninterrupted run's."""
    raw = config(tiny_model_dir, reachable_teacher, tmp_path, "whole")
    raw["train"]["save_every"] = 1
    whole, _ = start_run(from_dict(raw))
    whole.fit()

    def stop_at_3(step: int, metrics: dict) -> None:
        if step == 3:
            raise KeyError("stop")

    cut, _ = start_run(from_dict({**raw, "run": {**raw["run"], "name": "cut"}}))
    with pytest.raises(KeyError):
        cut.fit(on_step=stop_at_3)
    resumed, path = resume_run(tmp_path / "cut", [], allow_changes=False)
    assert path.name == "step-2"
    resumed.fit()
    volatile = ("time/", "throughput/", "memory/")
    read = lambda run, name: [json.loads(line) for line in (tmp_path / run / name).read_text().splitlines()]  # noqa: E731
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(volatile)} for r in rows]  # noqa: E731
    assert strip(read("whole", "metrics.jsonl")) == strip(read("cut", "metrics.jsonl"))
    assert read("whole", "samples.jsonl") == read("cut", "samples.jsonl")
    wa = load_file(ckpt.latest_checkpoint(tmp_path / "whole") / "model.safetensors")
    wb = load_file(ckpt.latest_checkpoint(tmp_path / "cut") / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)  # bitwise
