"""Supervised warm start for agent tasks: fine-tune on expert episodes, the loss on the expert's tokens only
(docs/agents.md, "Supervised warm start").

Data: one expert episode per *training* initial state of the agent task (grpolab.agents.expert: the environment's
scripted solver plays the model's part through the episode runner, so its episodes are token for token what GRPO
samples -- the prompt with the tool instructions, each turn closed by the template's end-of-turn token, the
observation tokens as the runner renders them). Episodes the expert did not solve (reward < 1, e.g. cut by a bound
the task sets too tight) are left out and counted.

Loss: an example is ``[prompt | episode]`` with labels = the token on the episode's loss mask (the expert's turns,
their end-of-turn tokens included) and -100 elsewhere (prompt and observations: context, never targets), the
episode mask GRPO's update uses; the token-mean cross-entropy of those tokens (grpolab.baselines.sft_bon.sft_loss),
AdamW, constant LR, gradient clipping, exactly ``steps`` optimizer steps of ``batch_size`` examples drawn epoch-wise
in a seeded shuffled order.

Result: an HF checkpoint directory with ``baseline_manifest.json`` (method ``sft-agent-expert``, its base model, the
training problems' hashes so ``grpolab eval`` refuses overlapping evaluation sets): usable as a GRPO run's
``model.name``, whose manifest then records this directory and its weights' hash (``model_path``,
``hashes.model_weights``); this manifest records the base below it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..agents.env import AgentTask
from ..agents.episode import EpisodeRunner
from ..agents.expert import ExpertEpisode, end_of_turn_id, expert_episode
from ..errors import GrpolabError
from .openai_expert import openai_expert_data
from .sft_bon import BASELINE_MANIFEST, collate, sft_loss, train_on_encoded

TASKS = ("agent", "openai_agent")


@dataclass(frozen=True)
class AgentSFTSettings:
    steps: int = 60  # optimizer steps
    batch_size: int = 8
    lr: float = 5e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    precision: str = "fp32"  # "fp32", "bf16" or "auto" (the probe decides, as train.precision)
    seed: int = 0


def encode_episode(ep: ExpertEpisode) -> tuple[list[int], list[int]]:
    """(input ids, labels): prompt + episode ids; labels are the ids on the loss mask, -100 elsewhere.

    >>> from grpolab.agents.episode import EpisodeResult
    >>> encode_episode(ExpertEpisode(None, [1, 2], [5, 6, 7, 8], [1, 1, 0, 1], EpisodeResult()))
    ([1, 2, 5, 6, 7, 8], [-100, -100, 5, 6, -100, 8])
    """
    labels = [-100] * len(ep.prompt) + [t if m else -100 for t, m in zip(ep.tokens, ep.loss_mask)]
    return ep.prompt + ep.tokens, labels


def expert_data(
    runner: EpisodeRunner, problems: list, task: str = "agent"
) -> tuple[list[ExpertEpisode], list[ExpertEpisode]]:
    """(solved, unsolved) expert episodes, one per problem: played by grpolab's runner (``agent``) or by the task's
    own agent through the endpoint (``openai_agent``: grpolab.baselines.openai_expert)."""
    eot = end_of_turn_id(runner)
    if task == "openai_agent":
        return openai_expert_data(runner.tokenizer, runner.stop_ids, eot, problems)
    episodes = [expert_episode(runner, p, eot) for p in problems]
    return [e for e in episodes if e.result.reward >= 1.0], [e for e in episodes if not e.result.reward >= 1.0]


@torch.no_grad()
def masked_loss(model, encoded: list[tuple[list[int], list[int]]], pad_id: int, batch_size: int = 16) -> float:
    """The mean cross-entropy over all labelled tokens of `encoded` (eval mode, fp32)."""
    was = model.training
    model.eval()
    total, tokens = 0.0, 0
    for i in range(0, len(encoded), batch_size):
        batch = collate(encoded[i : i + batch_size], pad_id)
        n = int((batch["labels"][:, 1:] != -100).sum())
        total += sft_loss(model, batch).item() * n
        tokens += n
    model.train(was)
    return total / max(tokens, 1)


def task_class(task: str) -> type[AgentTask]:
    """The agent task class of `task` (one of TASKS)."""
    if task not in TASKS:
        raise GrpolabError(f"agent sft: task {task!r}: expected one of {', '.join(TASKS)}")
    if task == "openai_agent":
        from ..agents.openai_agent import OpenAIAgentTask

        return OpenAIAgentTask
    return AgentTask


def expert_summary(solved: list[Any]) -> dict[str, float]:
    """Means over the expert's solved episodes: turns, tool calls, trained tokens and episode tokens."""
    n = len(solved)
    return {
        "turns_mean": sum(e.result.turns for e in solved) / n,
        "tool_calls_mean": sum(e.result.tool_calls for e in solved) / n,
        "trained_tokens_mean": sum(sum(e.loss_mask) for e in solved) / n,
        "episode_tokens_mean": sum(len(e.tokens) for e in solved) / n,
    }


def run_agent_sft(
    model_name: str,
    options: dict[str, Any],
    s: AgentSFTSettings,
    out_dir: Path,
    limit: int = 0,
    log: Callable[[str], None] = lambda line: None,
    task: str = "agent",
) -> dict[str, Any]:
    """Expert episodes of the agent task's training states, fine-tune, write the checkpoint + manifest to out_dir;
    ``log`` gets a progress line per stage and every 10 steps. ``task``: ``agent`` (grpolab's runner and tool
    syntax) or ``openai_agent`` (the task's own agent through the endpoint, the model's tool-call format:
    grpolab.baselines.openai_expert)."""
    from ..manifest import data_hash, problem_hashes, versions, write_json_atomic
    from ..models.load import load_causal_lm, load_tokenizer, resolve_model_path
    from ..rollout.grpolab_engine import eos_ids
    from ..training.metrics import peak_rss_mb
    from ..training.precision import resolve_update

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise GrpolabError(f"{out_dir}: exists and is not empty; choose another --out")
    if s.steps < 1 or s.batch_size < 1:
        raise GrpolabError(f"agent sft: steps and batch_size must be >= 1, got {s.steps} and {s.batch_size}")
    problems = task_class(task)(**options).problems("train")
    problems = problems[:limit] if limit > 0 else problems
    path = resolve_model_path(model_name)
    tokenizer, model = load_tokenizer(path), load_causal_lm(path, "float32")
    start = time.perf_counter()
    log(f"playing the expert on {len(problems)} training states")
    solved, unsolved = expert_data(EpisodeRunner(model, tokenizer, eos_ids(model, tokenizer)), problems, task)
    if not solved:
        raise GrpolabError(
            f"agent sft: the expert solved none of the {len(problems)} training states; are the task's "
            "bounds (max_turns, max_turn_tokens, max_total_tokens) wide enough for its solutions?"
        )
    encoded = [encode_episode(e) for e in solved]
    resolution = resolve_update(s.precision, model, s.batch_size, max(len(e.tokens) for e in solved))
    s = AgentSFTSettings(**{**asdict(s), "precision": resolution["update"]})
    log(f"{len(solved)} expert episodes ({len(unsolved)} unsolved); loss before training")
    before = masked_loss(model, encoded, tokenizer.pad_token_id)

    def progress(step: int, loss: float) -> None:
        if step % 10 == 0 or step == s.steps:
            log(f"step {step}/{s.steps}  loss {loss:.4f}  {time.perf_counter() - start:.0f}s")

    losses = train_on_encoded(model, encoded, tokenizer.pad_token_id, s, on_step=progress)
    after = masked_loss(model, encoded, tokenizer.pad_token_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    n = len(solved)
    manifest = {
        "grpolab_baseline": 1,
        "method": "sft-agent-expert",
        "base_model": model_name,
        "base_path": path,
        "config": {
            "model": {"name": model_name},
            "task": {"name": task, "options": options, "split": "train", "limit": limit},
            "train": asdict(s),
        },
        "num_problems": len(problems),
        "num_examples": n,
        "unsolved_by_expert": len(unsolved),
        "problems_with_examples": n,
        "expert": expert_summary(solved),
        "train_problem_hashes": problem_hashes(problems),
        "train_data_hash": data_hash(problems),
        "loss_before": before,
        "loss_after": after,
        "losses": losses,
        "precision": resolution,
        "budget": {"completions_sampled": 0, "optimizer_steps": s.steps},
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": peak_rss_mb(),
        "versions": versions(),
    }
    write_json_atomic(out_dir / BASELINE_MANIFEST, manifest)
    return manifest
