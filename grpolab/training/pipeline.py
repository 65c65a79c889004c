"""Asynchronous rollouts with a staleness bound (``rollout.max_staleness: k``; docs/async.md).

The schedule is a fixed lag: the batch of step s (0-based) is sampled with the weights after update max(0, s - k).
At the top of step s the trainer submits step s + k's generation to the engine's worker process (steps 0..k at
the first step, all with the initial weights) and takes step s's, generated while it updated; after the update it
queues the new weights behind the generations already in flight (QueuedEngine.sync_weights(wait=False)). The
worker answers in order, so every generation samples from exactly the weights queued before it: a sample is at most
k updates old (exactly k once s >= k), and which weights drew it never depends on timing. In-flight generations
finish on the weights they started with (no partial rollouts). On vLLM servers (rollout.engine vllm_server) a sync
lands inside the generations in flight instead (paused, updated, resumed: grpolab.rollout.server_engine): their
later tokens come from newer weights, each token's version is reported (Rollout.token_versions), and the bound is
checked on every token (``staleness_metrics``); where the sync falls then depends on timing.

Every step's batch carries its policy version (the number of updates applied to the weights that drew it); the update
treats the sampler's log-probabilities as the behaviour policy (the run's is_mode / is_reject /
offpolicy_mask_delta correct for it; config.checks refuses none). Metrics per step: ``async/staleness`` (updates
between the batch's oldest token's weights and the trained ones; ``async/staleness_mean``, ``async/spanning_frac``),
``async/policy_version`` (the newest weights when it was sent), ``async/wait_s`` (how long the trainer
waited for the batch: 0 when generation kept ahead), ``async/queued`` (steps submitted and not yet trained).

Exact resume: a checkpoint holds the queued steps' rollouts (waited for first: ``state_dict``) with their problems
and versions, and the prompt cursor that drew them; a resumed run trains on them and submits the later steps as an
uninterrupted run does, so its samples and weights are the same bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

import torch

from ..config import Config
from ..errors import ConfigError, GrpolabError
from ..rollout.base import QueuedEngine, Rollout
from ..rollout.engines import QUEUED_ENGINES
from ..tasks.base import Problem
from .batch import Batch, BatchCollector
from .distributed import World


@dataclass
class Queued:
    """A step whose generation was submitted: its problems, the groups this rank owns, the policy version that
    samples it, and the engine's pending generation (or, once collected, its rollout)."""

    step: int
    problems: list[Problem]
    owned: list[int]
    version: int
    pending: Any = None
    rollout: Rollout | None = None


def staleness_metrics(step: int, rollout: Rollout, version: int, sent_version: int, k: int) -> dict[str, float]:
    """The staleness of a step's batch, checked against the bound before it is trained on: ``version`` is the
    trainer's (updates applied), ``sent_version`` the engine's newest weights when the generation was sent. With
    per-token versions (Rollout.token_versions, vllm_server: a sync may land inside a completion) each sampled token
    t has staleness version - v_t, else every sample has version - sent_version. GrpolabError unless every staleness
    lies in [0, k]: older than the bound, or sampled by weights the trainer has not made. Metrics:
    ``async/staleness`` the largest (the oldest token), ``async/staleness_mean`` the mean over sampled tokens and
    ``async/spanning_frac`` the share of completions sampled under more than one version."""
    tokens = rollout.token_versions
    if tokens is None:
        ages, spanning = torch.tensor([version - sent_version]), 0.0
    else:
        mask = rollout.completion_mask.bool()
        ages = (version - tokens)[mask]
        lo = torch.where(mask, tokens, torch.iinfo(tokens.dtype).max).min(-1).values
        spanning = ((tokens.max(-1).values > lo) & mask.any(-1)).float().mean().item()
    if len(ages) and not (0 <= int(ages.min()) and int(ages.max()) <= k):
        raise GrpolabError(
            f"step {step}: its batch holds tokens sampled {int(ages.max())} to {int(ages.min())} updates before the "
            f"policy it trains (version {version}), outside [0, {k}] (rollout.max_staleness): the sampler served "
            "weights the schedule does not allow"
        )
    return {
        "async/staleness": float(ages.max()) if len(ages) else 0.0,
        "async/staleness_mean": float(ages.float().mean()) if len(ages) else 0.0,
        "async/spanning_frac": spanning,
    }


def rollout_state(rollout: Rollout) -> dict[str, Any]:
    """A Rollout as plain values (tensors, lists, None) for a checkpoint."""
    return {f.name: getattr(rollout, f.name) for f in fields(rollout)}


class RolloutPipeline:
    """The queue of submitted steps (module docstring). ``fill`` submits, ``take`` returns a step's batch."""

    def __init__(self, collector: BatchCollector, engine: QueuedEngine, max_staleness: int, steps: int):
        self.collector, self.engine, self.k, self.steps = collector, engine, max_staleness, steps
        self.queue: dict[int, Queued] = {}
        self.next_step = 0  # the first step not yet submitted

    def fill(self, step: int, version: int) -> None:
        """Submit every step up to step + k (and below train.steps) not submitted yet, to be sampled with the
        engine's newest weights, which are `version` updates old."""
        while self.next_step <= min(step + self.k, self.steps - 1):
            problems, owned, prompts, seeds = self.collector.draw_round(self.next_step)
            pending = self.engine.submit(prompts, self.collector.params, seeds)
            self.queue[self.next_step] = Queued(self.next_step, problems, owned, version, pending)
            self.next_step += 1

    def take(self, step: int, version: int) -> tuple[Batch, int]:
        """Step `step`'s batch (scored, advantages computed) and the policy version that sampled it; `version`: the
        trainer's (the updates applied so far)."""
        if step not in self.queue:
            raise GrpolabError(f"step {step}: its rollout was never submitted (queued: {sorted(self.queue)})")
        queued = self.queue.pop(step)
        t0 = time.perf_counter()
        rollout = queued.rollout if queued.rollout is not None else self.engine.finish(queued.pending)
        waited = time.perf_counter() - t0
        staleness = staleness_metrics(step, rollout, version, queued.version, self.k)  # before anything trains on it
        batch = self.collector.collect_rollout(queued.problems, queued.owned, rollout)
        self.collector.timing["rollout"] = waited
        batch.metrics.update(
            {
                **staleness,
                "async/policy_version": float(queued.version),
                "async/wait_s": waited,
                "async/queued": float(len(self.queue)),
            }
        )
        return batch, queued.version

    def state_dict(self) -> dict[str, Any]:
        """The queue for a checkpoint: every submitted step's rollout (waiting for those still in flight)."""
        self.engine.wait_all()
        for queued in self.queue.values():
            if queued.rollout is None:
                queued.rollout = self.engine.finish(queued.pending)
                queued.pending = None
        return {
            "max_staleness": self.k,
            "next_step": self.next_step,
            "queue": [
                {
                    "step": q.step,
                    "uids": [p.uid for p in q.problems],
                    "owned": q.owned,
                    "version": q.version,
                    "rollout": rollout_state(q.rollout),
                }
                for q in self.queue.values()
            ],
        }

    def load_state_dict(self, state: dict[str, Any], problems: list[Problem], where: str) -> None:
        """Restore a checkpoint's queue; `problems`: the run's training problems (found by uid); `where`: the
        checkpoint, for errors."""
        if state.get("max_staleness") != self.k:
            raise GrpolabError(
                f"{where}: its rollout queue was written with rollout.max_staleness = {state.get('max_staleness')}, "
                f"this run has {self.k}; resume with the same value"
            )
        by_uid = {p.uid: p for p in problems}
        missing = [u for q in state["queue"] for u in q["uids"] if u not in by_uid]
        if missing:
            raise GrpolabError(f"{where}: its queued rollouts answer problems this run does not have ({missing[0]})")
        self.queue = {
            q["step"]: Queued(
                q["step"], [by_uid[u] for u in q["uids"]], list(q["owned"]), q["version"], None, Rollout(**q["rollout"])
            )
            for q in state["queue"]
        }
        self.next_step = state["next_step"]


def make_pipeline(cfg: Config, collector: BatchCollector, engine: QueuedEngine, world: World) -> RolloutPipeline:
    """The run's pipeline (rollout.max_staleness > 0, one process, a QueuedEngine: rollout.engine grpolab_process,
    vllm or vllm_server; ConfigError naming the field otherwise)."""
    r = cfg.rollout
    if r.engine not in QUEUED_ENGINES:
        raise ConfigError(
            f"rollout.engine: expected one of {sorted(QUEUED_ENGINES)} with rollout.max_staleness > 0 (an engine in "
            f"its own process keeps the next steps' generations in flight), got {r.engine}"
        )
    if world.size > 1:
        raise ConfigError(
            f"rollout.max_staleness: expected 0 with more than one process (this run has {world.size}): the "
            "asynchronous pipeline is built and tested for one"
        )
    return RolloutPipeline(collector, engine, r.max_staleness, cfg.train.steps)
