"""LoRA (model.lora, grpolab/models/lora.py): the reference is the policy with its adapters disabled and equals the base
model exactly; the sampler holds the merged weights without the policy being merged; a LoRA run's checkpoint (the
adapter) resumes exactly; the merged export is a plain transformers model with the same logprobs."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from grpolab import cli
from grpolab.config import from_dict
from grpolab.errors import ConfigError, GrpolabError
from grpolab.models import checkpoint as ckpt
from grpolab.models.load import load_adapter_model, load_causal_lm, resolve_model_path
from grpolab.models.lora import AdapterOff, apply_lora, is_lora, save_model
from grpolab.runs import resume_run, start_run
from grpolab.training.forward import completion_logprobs
from grpolab.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
VOLATILE = ("time/", "throughput/", "memory/")


def lora_config(model_dir: str, out, name: str, **train) -> dict:
    """A tiny LoRA run with a KL term in the loss (so the disabled-adapter reference is used every step) and an
    entropy bonus (a gradient even when the random model earns no reward)."""
    return {
        "model": {"name": model_dir, "lora": {"rank": 4, "alpha": 8.0, "target_modules": "all-linear"}},
        "task": {"name": "arithmetic", "options": {"num_train": 50, "num_test": 20}},
        "rollout": {"group_size": 4, "max_new_tokens": 5, "dtype": "float32"},
        "algorithm": {"preset": "grpo", "beta": 0.04, "entropy_coef": 0.05},
        "train": {
            "steps": 4,
            "prompts_per_step": 2,
            "micro_batch_size": 8,
            "lr": 1e-2,
            "seed": 0,
            "samples_per_step": 2,
            "save_every": 1,
            "keep_last": 10,
            **train,
        },
        "eval": {"every_steps": 0},
        "run": {"output_dir": str(out), "name": name},
    }


def randomise_adapters(model, seed: int = 1) -> None:
    """Non-zero B (peft starts it at 0, which would make every comparison with the base model trivially equal)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def logprobs(model, rollout) -> torch.Tensor:
    with torch.no_grad():
        return completion_logprobs(model.eval(), rollout, torch.arange(len(rollout)), 1.0, "fp32").logp


@pytest.fixture(scope="module")
def built(tiny_model_dir, tmp_path_factory) -> tuple[Trainer, object]:
    """A LoRA trainer with random non-zero adapters, its sampler synced, and one collected batch."""
    cfg = from_dict(lora_config(tiny_model_dir, tmp_path_factory.mktemp("lora-built"), "built"))
    trainer = Trainer(cfg, tmp_path_factory.mktemp("lora-built-run"))
    randomise_adapters(trainer.policy)
    trainer.engine.sync_weights(trainer.policy)
    return trainer, trainer.collect()


def test_reference_with_adapters_disabled_equals_a_separately_loaded_base_model(built, tiny_model_dir):
    trainer, batch = built
    assert isinstance(trainer.reference, AdapterOff) and trainer.reference.policy is trainer.policy  # no copy
    ref = trainer.updater.logprobs_no_grad(trainer.reference, batch.rollout, "fp32")
    base = trainer.updater.logprobs_no_grad(load_causal_lm(tiny_model_dir), batch.rollout, "fp32")
    mask = batch.rollout.completion_mask.bool()
    assert torch.equal(ref[mask], base[mask])  # bitwise
    policy = trainer.updater.logprobs_no_grad(trainer.policy, batch.rollout, "fp32")
    assert (policy - base)[mask].abs().max() > 1e-2, "the adapters change the policy, so the test can tell"
    again = trainer.updater.logprobs_no_grad(trainer.policy, batch.rollout, "fp32")
    assert torch.equal(policy, again), "the adapters are enabled again after the reference pass"


def test_sampler_holds_merged_weights_and_the_policy_is_not_merged(built, tiny_model_dir):
    trainer, batch = built
    sampler, policy = trainer.engine.model, trainer.policy
    assert trainer.engine.own_copy and not is_lora(sampler)
    base = load_causal_lm(tiny_model_dir)
    layer = policy.get_base_model().model.layers[0].self_attn.q_proj
    assert torch.equal(layer.base_layer.weight, base.model.layers[0].self_attn.q_proj.weight), "policy not merged"
    peft_merged = _deepcopy_merged(policy)
    for name, p in sampler.named_parameters():
        assert torch.equal(p, peft_merged[name]), f"{name}: not peft's W + (alpha / r) B A"
    assert not torch.equal(
        sampler.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight
    )
    diff = (logprobs(sampler, batch.rollout) - logprobs(policy, batch.rollout))[batch.rollout.completion_mask.bool()]
    assert diff.abs().max() < 1e-4  # float32 rounding of the merge only


def test_a_bf16_step_trains_the_adapters_and_syncs_the_bf16_sampler(tiny_model_dir, tmp_path):
    raw = lora_config(tiny_model_dir, tmp_path, "bf16")
    raw["rollout"]["dtype"], raw["train"]["precision"] = "bfloat16", "bf16"
    trainer = Trainer(from_dict(raw), tmp_path / "bf16")
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    metrics, _ = trainer.train_step()
    changed = {n for n, p in trainer.policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n for n in changed), "only adapters move"
    merged = _deepcopy_merged(trainer.policy)
    for name, p in trainer.engine.model.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, merged[name].to(torch.bfloat16)), name


def _deepcopy_merged(policy) -> dict[str, torch.Tensor]:
    import copy

    return dict(copy.deepcopy(policy).merge_and_unload().named_parameters(remove_duplicate=False))


def test_only_adapters_are_trained_and_lora_init_leaves_the_global_rng_alone(built, tiny_model_dir):
    trainer, _ = built
    params = trainer.optimizer.param_groups[0]["params"]
    lora = [p for n, p in trainer.policy.named_parameters() if ".lora_" in n]
    assert len(params) == len(lora) > 0 and all(any(p is q for q in lora) for p in params)
    state = torch.get_rng_state()
    apply_lora(load_causal_lm(tiny_model_dir), trainer.cfg.model, tiny_model_dir, seed=0)
    assert torch.equal(state, torch.get_rng_state())


def test_the_adapter_names_a_bundled_base_by_its_alias(tiny_model_dir, tmp_path, recwarn):
    """The checkpoint says bundled:<alias>, not the cache path it was loaded from (which is another machine's)."""
    model_cfg = from_dict({"model": {"name": "bundled:smollm2-135m-instruct", "lora": {"rank": 2}}}).model
    save_model(apply_lora(load_causal_lm(tiny_model_dir), model_cfg, tiny_model_dir, seed=0), tmp_path)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["base_model_name_or_path"] == model_cfg.name
    assert not (tmp_path / "README.md").exists()  # peft's template card
    assert not [w for w in recwarn if "base_model_name_or_path" in str(w.message)]


# ----------------------------------------------------------------------------------------------- run, resume, export


@pytest.fixture(scope="module")
def whole(tiny_model_dir, tmp_path_factory):
    """An uninterrupted 4-step LoRA run with a checkpoint after every step."""
    out = tmp_path_factory.mktemp("lora-runs")
    trainer, _ = start_run(from_dict(lora_config(tiny_model_dir, out, "whole")))
    trainer.fit()
    return out / "whole"


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_lora_checkpoint_holds_the_adapter_and_resumes_exactly(whole, tmp_path):
    final = ckpt.latest_checkpoint(whole)
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    for step in (3, 4):  # as if the run had stopped after the checkpoint of step 2
        shutil.rmtree(ckpt.checkpoint_path(resumed, step))
    trainer, path = resume_run(resumed, [], allow_changes=False)
    assert path.name == "step-2" and trainer.step == 2
    trainer.fit()
    stable = lambda r: {k: v for k, v in r.items() if not k.startswith(VOLATILE)}  # noqa: E731
    a, b = rows(whole / "metrics.jsonl"), rows(resumed / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [stable(r) for r in a] == [stable(r) for r in b]
    assert a[-1]["policy/kl"] > 0, "the disabled-adapter reference was used"
    assert rows(whole / "samples.jsonl") == rows(resumed / "samples.jsonl")
    wa = load_file(final / "adapter_model.safetensors")
    wb = load_file(ckpt.latest_checkpoint(resumed) / "adapter_model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)  # bitwise
    first = load_file(ckpt.checkpoint_path(whole, 1) / "adapter_model.safetensors")
    assert any(not torch.equal(first[k], wa[k]) for k in wa), "the adapters trained"


def run_cli(monkeypatch, *args) -> int:
    monkeypatch.setattr(sys, "argv", ["grpolab", *map(str, args)])
    try:
        cli.main()
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def test_merged_export_loads_in_plain_transformers_with_the_same_logprobs(whole, tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "merged"
    assert run_cli(monkeypatch, "export", whole, "--merge", "--out", out) == 0
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    plain = AutoModelForCausalLM.from_pretrained(out)
    assert not is_lora(plain) and not getattr(plain, "_hf_peft_config_loaded", False)
    adapted = load_adapter_model(ckpt.latest_checkpoint(whole))
    trainer = Trainer(from_dict(lora_config(tiny_model_dir, tmp_path, "probe")), tmp_path / "probe")
    rollout = trainer.collect().rollout
    mask = rollout.completion_mask.bool()
    merged_lp, adapter_lp = logprobs(plain, rollout)[mask], logprobs(adapted, rollout)[mask]
    assert (merged_lp - adapter_lp).abs().max() < 1e-4  # merging rounds in float32: close, not bitwise
    assert (logprobs(load_causal_lm(tiny_model_dir), rollout)[mask] - adapter_lp).abs().max() > 1e-3, "not the base"
    assert torch.equal(logprobs(load_causal_lm(resolve_model_path(str(whole))), rollout)[mask], merged_lp), (
        "as eval reads it"
    )
    assert (out / "tokenizer.json").is_file()


def test_export_without_merge_writes_the_adapter_and_refuses_a_used_directory(whole, tmp_path, monkeypatch, capsys):
    out = tmp_path / "adapter"
    assert run_cli(monkeypatch, "export", whole, "--out", out) == 0
    assert {p.name for p in out.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"}
    base = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == json.loads((whole / "manifest.json").read_text())["model_path"]
    capsys.readouterr()
    assert run_cli(monkeypatch, "export", whole, "--merge", "--out", out) == 2
    assert "--out" in capsys.readouterr().err


def test_export_of_a_full_model_writes_it_in_the_asked_dtype(tiny_model_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "full"
    assert run_cli(monkeypatch, "export", tiny_model_dir, "--merge", "--out", out, "--dtype", "bfloat16") == 0
    assert "nothing to merge" in capsys.readouterr().out
    written, base = load_file(out / "model.safetensors"), load_causal_lm(tiny_model_dir).state_dict()
    assert all(torch.equal(t, base[k].to(torch.bfloat16)) for k, t in written.items()) and written


# ----------------------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "lora, message",
    [
        ({"rank": -1}, "model.lora.rank: expected an integer >= 0 (0 = off), got -1"),
        ({"rank": 8, "alpha": 0}, "model.lora.alpha: expected a number > 0, got 0.0"),
        ({"rank": 8, "dropout": 1.0}, "model.lora.dropout: expected a number in [0, 1), got 1.0"),
        ({"rank": 8, "target_modules": []}, "model.lora.target_modules: expected 'all-linear' or a non-empty list"),
        (
            {"rank": 8, "target_modules": "q_proj"},
            "model.lora.target_modules: expected 'all-linear' or a non-empty list",
        ),
        ({"rnak": 8}, "unknown field 'model.lora.rnak'; did you mean 'model.lora.rank'?"),
    ],
)
def test_bad_lora_settings_name_the_field(lora, message):
    with pytest.raises(ConfigError, match=None) as e:
        from_dict({"model": {"lora": lora}})
    assert str(e.value).startswith(message)


@pytest.mark.parametrize(
    "targets, message",
    [
        (["no_such_module"], "model.lora.target_modules: "),
        (
            ["embed_tokens", "q_proj"],
            "model.lora.target_modules: 'model.embed_tokens' shares its weight with 'lm_head'",
        ),
    ],
)
def test_targets_that_cannot_work_are_refused_when_the_run_is_built(tiny_model_dir, tmp_path, targets, message):
    raw = lora_config(tiny_model_dir, tmp_path, "bad")
    raw["model"]["lora"]["target_modules"] = targets
    with pytest.raises(ConfigError) as e:
        Trainer(from_dict(raw), tmp_path / "bad")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_full_checkpoint_is_not_loaded_into_a_lora_run(whole, tiny_model_dir, tmp_path):
    raw = lora_config(tiny_model_dir, tmp_path, "full")
    raw["model"]["lora"]["rank"] = 0
    trainer = Trainer(from_dict(raw), tmp_path / "full")
    with pytest.raises(GrpolabError, match="holds a LoRA adapter but this run has model.lora.rank = 0"):
        trainer.load(ckpt.latest_checkpoint(whole))
