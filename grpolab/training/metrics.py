"""Per-step metric computation helpers and the JSONL sink every run writes (metrics.jsonl, samples.jsonl).

Metric names are part of the interface (docs/design.md section 5).
"""

from __future__ import annotations

import json
import math
import random
import resource
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from ..algo.advantages import zero_signal_groups


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def sync_metrics(last_sync: dict[str, float]) -> dict[str, float]:
    """time/weight_sync_s and sync/bytes of the newest weight load a worker engine answered (RolloutEngine.last_sync);
    {} for the in-process engine, whose copy is made in place."""
    if not last_sync:
        return {}
    per_server = {f"sync/{k}": v for k, v in last_sync.items() if k.startswith("server/")}  # rollout.engine vllm_server
    return {"time/weight_sync_s": last_sync["total_s"], "sync/bytes": last_sync["bytes"], **per_server}


def reward_metrics(
    rewards: torch.Tensor, components: dict[str, torch.Tensor], invalid: torch.Tensor
) -> dict[str, float]:
    """reward/mean, reward/std (population, over valid samples), reward/<c>/mean, reward/invalid_frac.

    A component's mean is over the valid samples where it is finite: a log-only (weight 0) reward that failed on some
    samples is NaN there without invalidating them (its failures are reward/<c>/failed_frac)."""
    valid = ~invalid
    r = rewards[valid].double()
    out = {
        "reward/mean": r.mean().item() if r.numel() else math.nan,
        "reward/std": r.std(unbiased=False).item() if r.numel() else math.nan,
        "reward/invalid_frac": invalid.double().mean().item(),
    }
    for name, values in components.items():
        v = values[valid].double()
        v = v[torch.isfinite(v)]
        out[f"reward/{name}/mean"] = v.mean().item() if v.numel() else math.nan
    return out


def group_metrics(zero_std: torch.Tensor, slices: list[str]) -> dict[str, float]:
    """groups/frac_zero_std overall and groups/frac_zero_std/<slice> per slice label of the group's prompt."""
    out = {"groups/frac_zero_std": zero_std.double().mean().item()}
    by_slice: dict[str, list[float]] = defaultdict(list)
    for z, s in zip(zero_std.tolist(), slices):
        by_slice[s].append(float(z))
    if len(by_slice) > 1:
        for s, values in sorted(by_slice.items()):
            out[f"groups/frac_zero_std/{s}"] = sum(values) / len(values)
    return out


def completion_metrics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """completion/len_mean, len_max (tokens) and truncated_frac over completions with these lengths and flags."""
    lengths = lengths.double()
    return {
        "completion/len_mean": lengths.mean().item(),
        "completion/len_max": lengths.max().item(),
        "completion/truncated_frac": truncated.double().mean().item(),
    }


def agent_metrics(results: list[Any]) -> dict[str, float]:
    """Episode metrics of a batch of agent episodes (grpolab.agents.episode.EpisodeResult), logged as ``agent/*``:

    - ``agent/success_frac``: episodes whose reward reached full marks (>= 1), invalid ones counted as failures;
    - ``agent/turns_mean``, ``agent/tool_calls_mean``, ``agent/tool_errors_mean``, ``agent/model_tokens_mean``:
      per episode, over all episodes;
    - ``agent/ended_by/<x>_frac`` for x in done, max_turns, max_turn_tokens, max_total_tokens, invalid: the share of
      episodes each way of ending ended (they sum to 1);
    - ``agent/success_without_tool_frac``: among successful episodes of environments that require a tool, the share
      that made no tool call (NaN when there is none): a reward reached without the required tool use.
    """
    from ..agents.episode import ENDINGS

    n = len(results)
    if not n:
        return {}
    success = [r.reward >= 1.0 for r in results]  # NaN (invalid) compares False
    out = {
        "agent/success_frac": sum(success) / n,
        "agent/turns_mean": sum(r.turns for r in results) / n,
        "agent/tool_calls_mean": sum(r.tool_calls for r in results) / n,
        "agent/tool_errors_mean": sum(r.tool_errors for r in results) / n,
        "agent/model_tokens_mean": sum(r.model_tokens for r in results) / n,
        **{f"agent/ended_by/{e}_frac": sum(r.ended_by == e for r in results) / n for e in ENDINGS},
    }
    needs = [r for r, ok in zip(results, success) if ok and r.requires_tools]
    if any(r.requires_tools for r in results):
        out["agent/success_without_tool_frac"] = (
            (sum(r.tool_calls == 0 for r in needs) / len(needs)) if needs else math.nan
        )
    return out


def pick_table_groups(zero_variance: list[bool], k: int, seed: int, step: int) -> list[int]:
    """The groups of a step's completions table: k of them (all when fewer), half (rounded up) drawn from the
    zero-variance groups -- the ones that teach nothing, shown on purpose -- and the rest from the others, each kind
    topped up from the other when it runs short; drawn by random.Random(f"table/{seed}/{step}"), so the same run
    shows the same groups at the same step. Returned in batch order.

    >>> g = pick_table_groups([True, False, True, False, False], 2, seed=0, step=3)
    >>> len(g), sum(i in (0, 2) for i in g), g == pick_table_groups([True, False, True, False, False], 2, 0, 3)
    (2, 1, True)
    """
    rng = random.Random(f"table/{seed}/{step}")
    flat = [i for i, z in enumerate(zero_variance) if z]
    varied = [i for i, z in enumerate(zero_variance) if not z]
    n_flat = min(len(flat), max(k - len(varied), (k + 1) // 2))
    return sorted(rng.sample(flat, n_flat) + rng.sample(varied, min(len(varied), k - n_flat)))


def completion_table(batch: Any, tokenizer: Any, k: int, seed: int, step: int) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of a step's completions table: every completion of `pick_table_groups`' groups of a trained
    batch (grpolab.training.batch.Batch, advantages one per completion) with its prompt as the model saw it (special
    tokens removed), reward and reward components, advantage, length in tokens, finish reason (``length`` = cut at
    max_new_tokens, else ``stop``) and whether its group's rewards have zero variance."""
    r, scores = batch.rollout, batch.scores
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(r.group.tolist()):
        groups.setdefault(g, []).append(row)
    ids = list(groups)
    zero = [bool(zero_signal_groups(scores.rewards[groups[g]][None], ~scores.invalid[groups[g]][None])[0]) for g in ids]
    components = sorted(scores.components)
    columns = [
        "step",
        "group",
        "uid",
        "prompt",
        "completion",
        "reward",
        *(f"reward/{c}" for c in components),
        "advantage",
        "length",
        "finish_reason",
        "zero_variance_group",
    ]
    rows = []
    for j in pick_table_groups(zero, k, seed, step):
        for i in groups[ids[j]]:
            prompt = tokenizer.decode(r.prompt_ids[i][r.prompt_mask[i].bool()], skip_special_tokens=True)
            rows.append(
                [
                    step,
                    j,
                    batch.problems[ids[j]].uid,
                    prompt,
                    r.texts[i],
                    scores.rewards[i].item(),
                    *(scores.components[c][i].item() for c in components),
                    batch.advantages[i].item(),
                    int(r.completion_mask[i].sum()),
                    "length" if bool(r.truncated[i]) else "stop",
                    zero[j],
                ]
            )
    return columns, rows


class JsonlSink:
    """One JSON object per line: {"step": N, <metric>: value, ...}; flushed after every line."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {
            "step": step,
            **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()},
        }
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def truncate_log(path: Path, offset: int) -> int:
    """Cut a JSONL log back to `offset` bytes (its length when a checkpoint was saved); returns the bytes removed.

    Rows written after that checkpoint (and a half-written last line after a kill) belong to steps the resumed
    run will redo, so keeping them would duplicate those steps.
    """
    if not path.is_file():
        return 0
    size = path.stat().st_size
    if size > offset:
        with open(path, "r+b") as f:
            f.truncate(offset)
    return max(0, size - offset)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a metrics/samples JSONL file; an unterminated last line (a crash mid-write) is ignored."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def sample_rows(num_rows: int, n: int, group_size: int) -> list[int]:
    """n of num_rows group-major rows, spread over the groups: the first completion of every group, then the second
    of every group, ...

    >>> sample_rows(12, 5, 4)
    [0, 4, 8, 1, 5]
    """
    groups = num_rows // group_size
    return [g * group_size + k for k in range(group_size) for g in range(groups)][:n]


class NullSink:
    """What ranks other than 0 log to (rank 0 writes the run directory)."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def sample_records(batch: Any, step: int, n: int, group_size: int, policy_version: int | None) -> list[dict[str, Any]]:
    """samples.jsonl rows: n completions of the trained batch, spread over its groups (sample_rows); a per-token
    advantage (distillation) as each completion's mean over its tokens; ``policy_version`` with asynchronous
    rollouts (None: synchronous, not recorded)."""
    r = batch.rollout
    advantages = batch.advantages
    if advantages.dim() == 2:
        m = r.completion_mask.to(advantages.dtype)
        advantages = (advantages * m).sum(-1) / m.sum(-1).clamp(min=1)
    return [
        {
            "step": step,
            "uid": batch.problems[r.group[i]].uid,
            "gold": batch.problems[r.group[i]].answer,
            "completion": r.texts[i],
            "reward": batch.scores.rewards[i].item(),
            "advantage": advantages[i].item(),
            **{f"reward/{k}": v[i].item() for k, v in batch.scores.components.items()},
            **({"reason": batch.scores.results[i].reason} if batch.scores.results[i].reason else {}),
            **({"error": batch.scores.results[i].error} if batch.scores.results[i].error else {}),
            **({"policy_version": policy_version} if policy_version is not None else {}),
            **({"weight_version": r.weight_versions[i]} if r.weight_versions is not None else {}),
        }
        for i in sample_rows(len(r), n, group_size)
    ]
