"""The parts a Trainer is assembled from, one concern each (grpolab.training.trainer.Trainer.build calls them in
this order): the run's problems (from its task, or given in memory through grpolab.api) and its task, the rewards,
the policy, the reference model, the CPU training attention, the optimizer and its schedule.

Each function takes the config and what it needs, never the Trainer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ..agents.env import AgentTask
from ..config import Config
from ..errors import ConfigError, DataError, GrpolabError
from ..evaluation.overlap import overlapping
from ..manifest import problem_hashes
from ..models.load import load_causal_lm, load_tokenizer, make_reference
from ..models.lora import apply_lora, trainable_parameters
from ..rewards import RewardSet
from ..tasks import make_task
from ..tasks.base import Problem, Task
from .attention import NAME as ATTENTION_FP32
from .attention import use_training_attention
from .schedule import lr_lambda


def load_problems(cfg: Config, task: Task | None = None) -> tuple[list[Problem], list[Problem], dict[str, Any]]:
    """(train problems, held-out problems, data summary) of the config's task (made here when not given); an
    unreadable source is a DataError naming it.

    Rows a task skips for lacking a usable gold answer (its `last_skipped`) are counted in the summary; the
    task itself fails when more than its allowed share are bad (e.g. task.max_bad_fraction of gsm8k).
    """
    task = task if task is not None else make_task(cfg.task.name, **cfg.task.options)
    source = cfg.task.options.get("path", cfg.task.name)
    try:
        train = task.problems("train")
        summary = {"train_problems": len(train), "train_skipped": getattr(task, "last_skipped", 0)}
        held_out: list[Problem] = []
        if cfg.eval.every_steps:
            held_out = task.problems(cfg.eval.split)[: cfg.eval.num_problems]
            summary.update(held_out_problems=len(held_out), held_out_skipped=getattr(task, "last_skipped", 0))
        if getattr(task, "source", None):  # where the data came from (e.g. the hf task's fingerprints): the manifest
            summary["source"] = task.source
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{source}: cannot read the task data ({type(e).__name__}: {e})") from None
    if not train:
        raise DataError(f"{source}: no training problems")
    return train, held_out, summary


IN_MEMORY_TASK = "python"  # task.name of a run whose problems were given in memory (grpolab.api)


def is_dataset(obj: Any) -> bool:
    """A datasets.Dataset or DatasetDict (both have column_names), told apart from a list of problems."""
    return hasattr(obj, "column_names")


def _problem_list(where: str, items: Any) -> list[Problem]:
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise ConfigError(
            f"{where}: expected a list of grpolab.Problem or a datasets.Dataset, got {type(items).__name__}"
        )
    for i, p in enumerate(items):
        if not isinstance(p, Problem):
            raise ConfigError(
                f"{where}[{i}]: expected a grpolab.Problem(uid, question, answer), got {type(p).__name__}"
            )
    return list(items)


def _dataset_task(dataset: Any, fields: Mapping[str, Any] | None):
    from ..tasks.hf import HFTask

    return HFTask(dataset=dataset, **dict(fields or {}))


def _named_as_fields(message: str) -> str:
    """Task hf's error with its options named as the caller gave them: fields['X'] for task.options.X."""
    return re.sub(r"\btask\.options\.(\w+)", r"fields['\1']", message)


def in_memory_problems(
    cfg: Config, problems: Any, eval_problems: Any = None, fields: Mapping[str, Any] | None = None
) -> tuple[list[Problem], list[Problem], dict[str, Any]]:
    """(train, held-out, data summary) of problems given in memory (grpolab.api's ``problems=``:
    a list of Problem or a datasets.Dataset read with task hf's rules, ``fields`` its options); the held-out ones are cut to
    eval.num_problems, and any that shares a question with a training problem is a DataError naming it."""
    try:
        return _in_memory_problems(cfg, problems, eval_problems, fields)
    except GrpolabError as e:
        message = _named_as_fields(str(e))
        if message == str(e):
            raise
        raise type(e)(message) from None


def _in_memory_problems(
    cfg: Config, problems: Any, eval_problems: Any, fields: Mapping[str, Any] | None
) -> tuple[list[Problem], list[Problem], dict[str, Any]]:
    source: dict[str, Any] = {"kind": IN_MEMORY_TASK}
    task = _dataset_task(problems, fields) if is_dataset(problems) else None
    train = task.problems("train") if task else _problem_list("problems", problems)
    if not train:
        raise ConfigError("problems: no training problems")
    held_out: list[Problem] = []
    if eval_problems is not None:
        held_out = (
            _dataset_task(eval_problems, fields).problems("train")
            if is_dataset(eval_problems)
            else _problem_list("eval_problems", eval_problems)
        )
    elif task is not None and cfg.eval.every_steps:
        held_out = task.problems("test")
    if task is not None:
        source.update(task.source, kind=IN_MEMORY_TASK)
    if cfg.eval.every_steps and not held_out:
        raise ConfigError(
            "eval_problems: eval.every_steps > 0 needs held-out problems; pass eval_problems=[...] (or a "
            "datasets.Dataset as problems, whose test split or held-out fraction is used), or set "
            "eval.every_steps=0"
        )
    held_out = held_out[: cfg.eval.num_problems] if cfg.eval.every_steps else held_out
    shared = overlapping(held_out, problem_hashes(train))
    if shared:
        raise DataError(
            f"eval_problems: {len(shared)} of {len(held_out)} held-out problems share a question with a "
            f"training problem (e.g. {shared[0].uid}: {shared[0].question[:80]!r}); hold them out"
        )
    summary = {"train_problems": len(train), "held_out_problems": len(held_out), "source": source}
    return train, held_out, summary


def _nothing_to_close() -> None:
    pass


@dataclass
class RunProblems:
    """The run's problems; ``close``: lets go of what the task holds (an agent task's servers) when the run ends."""

    train: list[Problem]
    held_out: list[Problem]
    summary: dict[str, Any]
    close: Callable[[], None] = field(default=_nothing_to_close)


def run_problems(cfg: Config, given: tuple[list[Problem], list[Problem], dict[str, Any]] | None) -> RunProblems:
    """The problems given in memory (grpolab.api), or those of the config's task."""
    if given is not None:
        return RunProblems(*given)
    task = make_task(cfg.task.name, **cfg.task.options)
    close = task.close if isinstance(task, AgentTask) else _nothing_to_close
    return RunProblems(*load_problems(cfg, task), close=close)


def build_rewards(cfg: Config, callables: dict[str, Callable[..., Any]] | None, device: torch.device) -> RewardSet:
    """The weighted rewards of reward.*, with the Python callables given beside the config (grpolab.api)."""
    r = cfg.reward
    return RewardSet(
        r.weights,
        r.functions,
        r.time_limit_s,
        r.sandbox,
        callables=callables,
        model=r.model,
        device=device,
        judge=r.judge,
    )


def load_policy(cfg: Config, model_path: Path | str, device: torch.device) -> tuple[Any, torch.nn.Module]:
    """(tokenizer, policy in training mode on `device`); a peft model when model.lora.rank > 0."""
    tokenizer = load_tokenizer(model_path)
    policy = apply_lora(load_causal_lm(model_path, cfg.model.dtype), cfg.model, model_path, cfg.train.seed)
    policy = policy.to(device)
    policy.train()
    return tokenizer, policy


def build_reference(cfg: Config, policy: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module | None:
    """The frozen reference model in `dtype` when algorithm.beta > 0 (LoRA: the policy with its adapters off)."""
    return make_reference(policy, dtype) if cfg.algorithm.beta > 0 else None


def cpu_attention_note(cfg: Config, device: torch.device, policy: torch.nn.Module, fp32_inside: bool) -> str | None:
    """Switch the policy's training attention on a CPU (grpolab.training.attention) and say so for the manifest's
    precision record when it is the float32 kernel inside bf16 autocast; None otherwise."""
    if device.type != "cpu" or not (fp32_inside or cfg.train.deterministic):
        return None
    if use_training_attention(policy, fp32_inside) != ATTENTION_FP32:
        return None
    return "float32 inside bf16 autocast (sdpa_fp32)"


def build_optimizer(
    cfg: Config, policy: torch.nn.Module, sharded: bool
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters (fused unless sharded, speed.fused_adamw) and its LR schedule."""
    t = cfg.train
    optimizer = torch.optim.AdamW(
        trainable_parameters(policy),
        lr=t.lr,
        weight_decay=t.weight_decay,
        betas=(t.adam_beta1, t.adam_beta2),
        **({"fused": True} if cfg.speed.fused_adamw and not sharded else {"foreach": True}),
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
