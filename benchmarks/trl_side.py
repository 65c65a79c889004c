"""TRL's GRPOTrainer set up from a grpolab config: the one translation the TRL benchmarks share.

The objective's settings are the ones grpolab's own card gives for TRL (`grpolab.card.equivalents`, checked
against TRL's numbers in tests/test_card_peers.py); this module adds what the card leaves to the user -- sampling,
optimiser, micro-batching, seed, machine -- and the data: grpolab's training problems in the order grpolab's prompt
sampler takes them, in TRL's conversational format, scored by grpolab's reward wrapped as a TRL reward function.
"""

from __future__ import annotations

from typing import Any, Callable

TRL_SCHEDULES = {"constant": "constant", "cosine": "cosine", "linear": "linear"}


def ordered_problems(cfg, n: int) -> list:
    """The first n training problems in the order grpolab's prompt sampler takes them (TRL gets this list unshuffled)."""
    from grpolab.training.builders import load_problems
    from grpolab.training.prompt_sampler import PromptSampler

    train, _, _ = load_problems(cfg)
    return PromptSampler(train, cfg.train.seed).take(n)


def trl_dataset(problems: list):
    """TRL's conversational rows: the prompt as one user message, the gold answer and uid as extra columns."""
    from datasets import Dataset

    from grpolab.tasks import render_prompt

    return Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": render_prompt(p)}], "answer": p.answer, "uid": p.uid}
            for p in problems
        ]
    )


def trl_reward(weights: dict[str, float]) -> Callable[..., list[float | None]]:
    """grpolab's reward, unchanged; an invalid result is None (TRL: unscorable, excluded), never 0."""
    from grpolab.rewards import score_completion

    def grpolab_reward(prompts, completions, answer, **kwargs):
        out: list[float | None] = []
        for completion, gold in zip(completions, answer):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            r = score_completion(text, gold, weights)
            out.append(None if r.invalid else r.total)
        return out

    return grpolab_reward


def trl_settings(cfg, *, bf16: bool, max_steps: int, gradient_checkpointing: bool) -> dict[str, Any]:
    """GRPOConfig keyword arguments for the run `cfg` describes, on one CPU process (output_dir and saving aside).

    Objective: the card's TRL row (exact for the presets the benchmarks use). Execution like grpolab's: the step's
    rollouts generated at once (generation_batch_size = prompts_per_step * G), trained in micro-batches of
    train.micro_batch_size with gradient accumulation, so one optimizer step per rollout batch when mu = 1.
    """
    from trl import GRPOConfig

    from grpolab.card import equivalents, peer_settings

    t, r = cfg.train, cfg.rollout
    if t.schedule not in TRL_SCHEDULES:
        raise SystemExit(f"train.schedule={t.schedule!r}: the TRL benchmarks translate {sorted(TRL_SCHEDULES)}")
    rollouts = t.prompts_per_step * r.group_size
    if rollouts % t.micro_batch_size:
        raise SystemExit(
            f"train.micro_batch_size={t.micro_batch_size} must divide prompts_per_step * group_size = {rollouts}"
        )
    settings = peer_settings(equivalents(cfg)["trl"])
    # transformers >= 5.2x renamed gradient_checkpointing (TRL's default: True) to activation_checkpointing
    ckpt_field = (
        "activation_checkpointing"
        if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
        else "gradient_checkpointing"
    )
    settings.update(
        {
            ckpt_field: gradient_checkpointing,
            "use_cpu": True,
            "bf16": bf16,
            "fp16": False,
            "generation_batch_size": rollouts,
            "per_device_train_batch_size": t.micro_batch_size,
            "gradient_accumulation_steps": rollouts // t.micro_batch_size,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
            "learning_rate": t.lr,
            "lr_scheduler_type": TRL_SCHEDULES[t.schedule],
            "warmup_steps": t.warmup_steps,
            "weight_decay": t.weight_decay,
            "adam_beta1": t.adam_beta1,
            "adam_beta2": t.adam_beta2,
            "max_grad_norm": t.grad_clip,
            "max_steps": max_steps,
            "shuffle_dataset": False,
            "seed": t.seed,
            "logging_steps": 1,
            "report_to": "none",
            "disable_tqdm": True,
            "log_completions": False,
            "model_init_kwargs": {"dtype": "float32"},
            "dataloader_num_workers": 0,
        }
    )
    return settings
